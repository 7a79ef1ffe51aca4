// Real servers for the tests: `delaywheel serve` on a free port (the repository's
// Python, .venv/bin/python, or $DELAYWHEEL_PYTHON), a server and a client for a file's
// tests (`serverAndClient`), a private redis-server, certificates made with openssl,
// and the Python client run in a subprocess.
import { spawn, spawnSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import * as net from "node:net";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { after, before } from "node:test";
import { fileURLToPath } from "node:url";

import { Client } from "delaywheel-client";

export const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../..");
export const PYTHON = process.env.DELAYWHEEL_PYTHON ?? path.join(REPO, ".venv/bin/python");
const LISTENING = /delaywheel listening on (\S+):(\d+)/;
const API_LINE = /http api on (\S+)/;
const START_TIMEOUT_MS = 30_000;

export function tempDir(prefix = "dw-node-") {
  return mkdtempSync(path.join(tmpdir(), prefix));
}

export function removeDir(dir) {
  rmSync(dir, { recursive: true, force: true });
}

/** A TCP port of 127.0.0.1 that nothing listened on a moment ago. */
export function freePort() {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Poll `condition` (maybe async) until it is truthy, for at most `timeoutMs`. */
export async function waitUntil(condition, timeoutMs, what) {
  const deadline = Date.now() + timeoutMs;
  let last;
  for (;;) {
    try {
      if (await condition()) return;
    } catch (exc) {
      last = exc;
    }
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}: ${last ?? ""}`);
    await sleep(50);
  }
}

/** `delaywheel serve` in a process of its own; `args` come after the defaults (a later
 * `--port` wins over `--port 0`). */
export class Server {
  constructor(args = [], { store = "memory://", tick = "0.05" } = {}) {
    this.args = ["--port", "0", "--store", store, ...(tick === null ? [] : ["--tick", tick]), ...args];
    this.log = [];
    this.host = "";
    this.port = 0;
  }

  static async start(args, options) {
    const server = new Server(args, options);
    await server.start();
    return server;
  }

  get address() {
    return `${this.host}:${this.port}`;
  }

  start() {
    this.proc = spawn(PYTHON, ["-m", "delaywheel", "serve", ...this.args], {
      cwd: REPO,
      stdio: ["ignore", "ignore", "pipe"],
    });
    const proc = this.proc;
    this.exited = new Promise((resolve) => proc.once("exit", (code, signal) => resolve(code ?? signal)));
    return new Promise((resolve, reject) => {
      let pending = "";
      let found = false;
      const timer = setTimeout(() => fail("did not listen in time"), START_TIMEOUT_MS);
      const fail = (why) => {
        clearTimeout(timer);
        proc.kill("SIGKILL");
        reject(new Error(`server ${why}:\n${this.log.join("\n")}`));
      };
      const onExit = () => fail("exited");
      proc.once("exit", onExit);
      proc.stderr.setEncoding("utf8");
      proc.stderr.on("data", (chunk) => {
        pending += chunk;
        const lines = pending.split("\n");
        pending = lines.pop();
        for (const line of lines) {
          this.log.push(line);
          if (this.log.length > 2000) this.log.shift();
          const match = LISTENING.exec(line);
          if (match && !found) {
            found = true;
            this.host = match[1];
            this.port = Number(match[2]);
            clearTimeout(timer);
            proc.removeListener("exit", onExit);
            resolve(this);
          }
        }
      });
    });
  }

  /** Stop (SIGTERM) and start again on the same port. */
  async restart() {
    await this.stop();
    this.args.push("--port", String(this.port));
    await this.start();
  }

  /** The HTTP API's base URL (`http://HOST:PORT/v1`), from the log (with `--api-port`). */
  get apiUrl() {
    const line = this.log.find((text) => API_LINE.test(text));
    if (!line) throw new Error(`no "http api on" line:\n${this.log.join("\n")}`);
    return API_LINE.exec(line)[1];
  }

  async stop() {
    if (!this.proc || this.proc.exitCode !== null || this.proc.signalCode !== null) return;
    this.proc.kill("SIGTERM");
    const timer = setTimeout(() => this.proc.kill("SIGKILL"), 15_000);
    await this.exited;
    clearTimeout(timer);
  }
}

/** A server (`args` for it) and a Client on it for the tests of a file, or of the
 * `describe` this is called in: started before them, closed after. `ready(server, client)`
 * is called once both are up, to keep them where the tests see them. */
export function serverAndClient(ready, args = []) {
  let server;
  let client;
  before(async () => {
    server = await Server.start(args);
    client = new Client({ host: server.host, port: server.port });
    ready(server, client);
  });
  after(async () => {
    client?.close();
    await server?.stop();
  });
}

/** A private redis-server on a free port (never the machine's 6379), AOF on, in `dir`. */
export class RedisServer {
  static async start(dir) {
    const redis = new RedisServer();
    redis.port = await freePort();
    redis.proc = spawn(
      "redis-server",
      ["--port", String(redis.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes",
        "--dir", dir, "--logfile", "redis.log", "--daemonize", "no"],
      { stdio: "ignore" },
    );
    redis.exited = new Promise((resolve) => redis.proc.once("exit", resolve));
    await waitUntil(() => redis.answers(), 10_000, `redis-server on port ${redis.port}`);
    return redis;
  }

  get url() {
    return `redis://127.0.0.1:${this.port}/0`;
  }

  answers() {
    return new Promise((resolve) => {
      const socket = net.connect(this.port, "127.0.0.1");
      socket.once("error", () => resolve(false));
      socket.once("connect", () => socket.write("PING\r\n"));
      socket.once("data", (data) => {
        socket.destroy();
        resolve(data.toString().startsWith("+PONG"));
      });
    });
  }

  async stop() {
    this.proc.kill("SIGTERM");
    await this.exited;
  }
}

/** Run `code` with the repository's Python (the Python client importable); its stdout. */
export function python(code, args = []) {
  const done = spawnSync(PYTHON, ["-c", code, ...args], { cwd: REPO, encoding: "utf8", timeout: 60_000 });
  if (done.status !== 0) throw new Error(`python failed (${done.status}):\n${done.stderr}`);
  return done.stdout;
}

/** A CA, a server certificate for 127.0.0.1 and localhost and a client certificate,
 * made with openssl. */
export function makeCerts(dir) {
  const openssl = (...args) => {
    const done = spawnSync("openssl", args, { cwd: dir, encoding: "utf8", timeout: 60_000 });
    if (done.status !== 0) throw new Error(`openssl ${args.join(" ")} failed:\n${done.stderr}`);
  };
  openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
    "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=delaywheel node test ca",
    "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign");
  openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
    "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=delaywheel node test server");
  writeFileSync(
    path.join(dir, "server.ext"),
    "basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
  );
  openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
    "-out", "server.pem", "-days", "2", "-extfile", "server.ext");
  openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
    "-keyout", "client.key", "-out", "client.csr", "-subj", "/CN=delaywheel node test client");
  writeFileSync(path.join(dir, "client.ext"), "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n");
  openssl("x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
    "-out", "client.pem", "-days", "2", "-extfile", "client.ext");
  const at = (name) => path.join(dir, name);
  return {
    ca: at("ca.pem"),
    cert: at("server.pem"),
    key: at("server.key"),
    clientCert: at("client.pem"),
    clientKey: at("client.key"),
  };
}

/** A name no other test uses. */
let counter = 0;
export function unique(prefix) {
  counter += 1;
  return `${prefix}-${process.pid}-${counter}-${Math.random().toString(36).slice(2, 8)}`;
}
