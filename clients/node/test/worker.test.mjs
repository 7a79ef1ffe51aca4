// Worker against a real server: ack on success, release with backoff on a throw,
// concurrency, and stop().
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { Client, Worker } from "delaywheel-client";
import { Server, serverAndClient, unique, waitUntil } from "./servers.mjs";

// Failures are expected here: keep them off the test output, but keep them.
function quietLogger() {
  const lines = [];
  return { lines, warn: (m) => lines.push(m), error: (m) => lines.push(m) };
}

describe("Worker", () => {
  let dw;
  serverAndClient((_, client) => {
    dw = client;
  });

  test("a handler per topic; a task is acked when its handler succeeds", async () => {
    const emails = unique("emails");
    const sms = unique("sms");
    const seen = [];
    const worker = new Worker(dw, { reserveTimeoutS: 0.2 })
      .handle(emails, async (task) => seen.push(["email", task.body]))
      .handle(sms, (task) => seen.push(["sms", task.body]));
    const a = await dw.add(emails, "to a");
    const b = await dw.add(sms, "to b");
    assert.equal(await worker.run({ maxTasks: 2 }), 2);
    assert.deepEqual(seen.sort(), [["email", "to a"], ["sms", "to b"]]);
    assert.equal(await dw.get(a.id), null, "acked");
    assert.equal(await dw.get(b.id), null, "acked");
  });

  test("a throw releases the task with backoff, and the last attempt leaves it dead", async () => {
    const topic = unique("flaky");
    const logger = quietLogger();
    const worker = new Worker(dw, { reserveTimeoutS: 0.2, retryBaseS: 30, logger });
    worker.handle(topic, () => {
      throw new Error("boom");
    });
    const { id } = await dw.add(topic, "x", { maxAttempts: 2 });
    const before = Date.now() / 1000;
    assert.equal(await worker.run({ maxTasks: 1 }), 1);
    const released = await dw.get(id);
    assert.equal(released.state, "delayed");
    assert.equal(released.attempts, 1);
    // retryBaseS * 2 ** (1 - 1) = 30 s later
    assert.ok(released.at >= before + 29, `released to ${released.at - before} s from now`);
    assert.ok(logger.lines.some((line) => line.includes("releasing it for 30 s")), logger.lines.join("\n"));
    await dw.update(id, { delay: 0 });
    assert.equal(await worker.run({ maxTasks: 1 }), 1);
    assert.equal((await dw.get(id)).state, "dead");
    assert.ok(logger.lines.some((line) => line.includes("last attempt")), logger.lines.join("\n"));
  });

  test("retryDelayS doubles to the cap", () => {
    const worker = new Worker(dw, { retryBaseS: 1, retryCapS: 10 });
    assert.deepEqual([1, 2, 3, 4, 5, 100].map((n) => worker.retryDelayS(n)), [1, 2, 4, 8, 10, 10]);
  });

  test("concurrency: that many tasks in hand at once, each acked", async () => {
    const topic = unique("parallel");
    const ids = (await dw.addMany(Array.from({ length: 12 }, (_, n) => ({ topic, body: n })))).map((r) => r.id);
    let inHand = 0;
    let most = 0;
    const worker = new Worker(dw, { concurrency: 4, reserveTimeoutS: 0.2 });
    worker.handle(topic, async () => {
      inHand += 1;
      most = Math.max(most, inHand);
      await new Promise((resolve) => setTimeout(resolve, 300)); // long beside a reserve, even under load
      inHand -= 1;
    });
    assert.equal(await worker.run({ maxTasks: 12 }), 12);
    assert.equal(most, 4);
    for (const id of ids) assert.equal(await dw.get(id), null);
  });

  test("stop() ends run() after the task in hand", async () => {
    const topic = unique("stop");
    const worker = new Worker(dw, { reserveTimeoutS: 5 });
    const handled = [];
    worker.handle(topic, (task) => handled.push(task.id));
    const running = worker.run();
    const { id } = await dw.add(topic, 1);
    await waitUntil(() => handled.length === 1, 10_000, "the task handled");
    worker.stop();
    assert.equal(await running, 1);
    await waitUntil(async () => (await dw.get(id)) === null, 10_000, "the task acked");
  });

  test("a worker over a server that is down backs off and goes on when it is back", async () => {
    const other = await Server.start();
    const port = other.port;
    const client = new Client({ host: other.host, port, retries: 0 });
    const logger = quietLogger();
    const topic = unique("comeback");
    const worker = new Worker(client, { reserveTimeoutS: 0.2, logger }).handle(topic, () => undefined);
    try {
      await other.stop();
      const running = worker.run({ maxTasks: 1 });
      await waitUntil(() => logger.lines.some((l) => l.includes("reserve failed")), 10_000, "a failed reserve");
      other.args.push("--port", String(port));
      await other.start();
      const { id } = await client.add(topic, "back");
      assert.equal(await running, 1);
      assert.equal(await client.get(id), null);
    } finally {
      worker.stop();
      client.close();
      await other.stop();
    }
  });
});
