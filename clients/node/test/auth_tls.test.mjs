// Token auth and TLS against real servers.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { Client, ConnectionFailed, Unauthorized, Worker } from "delaywheel-client";
import { Server, makeCerts, removeDir, tempDir } from "./servers.mjs";

test("a server with a token: no token, a wrong one, the right one", async () => {
  const token = "s3cret-token";
  const server = await Server.start(["--token", token]);
  const anonymous = new Client({ host: server.host, port: server.port });
  const wrong = new Client({ host: server.host, port: server.port, token: "nope" });
  const right = new Client(`delaywheel://${token}@${server.host}:${server.port}`);
  try {
    assert.equal(await anonymous.ping(), "pong", "ping needs no auth");
    await assert.rejects(anonymous.add("t", 1), (exc) => exc instanceof Unauthorized && exc.code === "unauthorized");
    await assert.rejects(wrong.ping(), Unauthorized);
    // A Worker with a wrong token: every loop ends, and run() with the error.
    const worker = new Worker(wrong, { concurrency: 3 }).handle("t", () => undefined);
    await assert.rejects(worker.run(), Unauthorized);
    const { id } = await right.add("t", 1);
    assert.equal((await right.get(id)).body, 1);
    // A new connection (after a restart) authenticates again by itself.
    await server.restart();
    assert.equal((await right.get(id)), null, "memory:// lost the task, but the call got through");
    assert.equal((await right.add("t", 2)).id.length > 0, true);
  } finally {
    for (const dw of [anonymous, wrong, right]) dw.close();
    await server.stop();
  }
});

test("TLS: the server's certificate verified with its CA; an unknown CA is refused at once", async () => {
  const dir = tempDir();
  try {
    const certs = makeCerts(dir);
    const server = await Server.start(["--tls-cert", certs.cert, "--tls-key", certs.key]);
    const ca = readFileSync(certs.ca);
    const dw = new Client({ host: server.host, port: server.port, tls: { ca } });
    const byName = new Client({ host: "localhost", port: server.port, tls: { ca } });
    // Retried, its backoffs alone would add up to 4.5 s: the check below has room for a slow handshake.
    const untrusting = new Client({ host: server.host, port: server.port, tls: true, retries: 8 });
    const plain = new Client({ host: server.host, port: server.port, retries: 0, timeoutS: 5 });
    try {
      assert.equal(await dw.ping(), "pong");
      const { id } = await dw.add("tls", Buffer.from("over tls"));
      assert.deepEqual(Buffer.from((await byName.get(id)).body), Buffer.from("over tls"));
      assert.equal((await dw.stats()).tls, true);
      const started = Date.now();
      await assert.rejects(untrusting.ping(), (exc) => exc instanceof ConnectionFailed && /certificate/i.test(exc.message));
      assert.ok(Date.now() - started < 3000, "a certificate that does not verify is not retried");
      await assert.rejects(plain.ping(), ConnectionFailed);
    } finally {
      for (const client of [dw, byName, untrusting, plain]) client.close();
      await server.stop();
    }
  } finally {
    removeDir(dir);
  }
});

test("TLS with client certificates (--tls-client-ca): ours is taken, none is refused", async () => {
  const dir = tempDir();
  try {
    const certs = makeCerts(dir);
    const server = await Server.start(["--tls-cert", certs.cert, "--tls-key", certs.key, "--tls-client-ca", certs.ca]);
    const ca = readFileSync(certs.ca);
    const withCert = new Client({
      host: server.host,
      port: server.port,
      tls: { ca, cert: readFileSync(certs.clientCert), key: readFileSync(certs.clientKey) },
    });
    const without = new Client({ host: server.host, port: server.port, tls: { ca }, retries: 0 });
    try {
      assert.equal(await withCert.ping(), "pong");
      await assert.rejects(without.ping(), ConnectionFailed);
    } finally {
      withCert.close();
      without.close();
      await server.stop();
    }
  } finally {
    removeDir(dir);
  }
});
