// Client against a real server: every method, errors as classes, pipelining, reconnect.
import assert from "node:assert/strict";
import * as path from "node:path";
import { describe, test } from "node:test";

import {
  BadRequest,
  Client,
  Conflict,
  ConnectionFailed,
  DelaywheelError,
  Exists,
  NoMethod,
  NotFound,
  ServerClosed,
  TooLarge,
} from "delaywheel-client";
import { Server, removeDir, serverAndClient, tempDir, unique } from "./servers.mjs";

describe("Client on one server", () => {
  let dw;
  serverAndClient((_, client) => {
    dw = client;
  });

  test("ping, add, get, reserve, touch, ack", async () => {
    assert.equal(await dw.ping(), "pong");
    const topic = unique("basic");
    const added = await dw.add(topic, { to: "a@example.com" }, { ttr: 30, maxAttempts: 3 });
    assert.equal(typeof added.id, "string");
    assert.equal(typeof added.at, "number");
    const task = await dw.get(added.id);
    assert.equal(task.state, "ready");
    assert.deepEqual(task.body, { to: "a@example.com" });
    assert.equal(task.ttr, 30);
    assert.equal(task.max_attempts, 3);
    assert.deepEqual(task.target, { type: "queue" });
    const reserved = await dw.reserve(topic, 1);
    assert.equal(reserved.id, added.id);
    assert.equal(reserved.state, "reserved");
    assert.equal(reserved.attempts, 1);
    const deadline = await dw.touch(added.id);
    assert.ok(deadline >= reserved.deadline, `touch gave ${deadline}, before ${reserved.deadline}`);
    assert.equal(await dw.ack(added.id), true);
    assert.equal(await dw.get(added.id), null);
    assert.equal(await dw.reserve(topic), null);
  });

  test("add with an id, delay and at; update; delete", async () => {
    const topic = unique("delayed");
    const id = unique("id");
    const added = await dw.add(topic, "hello", { id, delay: 3600 });
    assert.equal(added.id, id);
    assert.equal((await dw.get(id)).state, "delayed");
    const at = Date.now() / 1000 + 7200;
    const atTask = await dw.add(topic, null, { at });
    assert.ok(Math.abs((await dw.get(atTask.id)).at - at) < 0.01);
    const updated = await dw.update(id, { delay: 0, body: [1, 2, 3], ttr: 5 });
    assert.equal(updated.state, "ready");
    assert.deepEqual(updated.body, [1, 2, 3]);
    assert.equal(updated.ttr, 5);
    assert.equal(await dw.delete(id), true);
    assert.equal(await dw.delete(id), false);
    assert.equal(await dw.get(id), null);
  });

  test("addMany is all or nothing and answers in order", async () => {
    const topic = unique("many");
    const ids = [unique("m"), unique("m"), unique("m")];
    const results = await dw.addMany(ids.map((id, n) => ({ id, topic, body: n, delay: 60 })));
    assert.deepEqual(results.map((r) => r.id), ids);
    const taken = unique("m");
    await assert.rejects(
      dw.addMany([{ id: taken, topic }, { topic, delay: -5 }]),
      (exc) => exc instanceof BadRequest && /task 1/.test(exc.message),
    );
    assert.equal(await dw.get(taken), null, "a refused batch adds nothing");
  });

  test("list is an async iterator over pages; tasks() over every task", async () => {
    const topic = unique("list");
    await dw.addMany(Array.from({ length: 25 }, (_, n) => ({ topic, body: n, delay: 600 })));
    const sizes = [];
    const bodies = [];
    for await (const page of dw.list({ topic, limit: 10 })) {
      sizes.push(page.tasks.length);
      bodies.push(...page.tasks.map((t) => t.body));
    }
    assert.deepEqual(sizes, [10, 10, 5]);
    assert.deepEqual(bodies, Array.from({ length: 25 }, (_, n) => n));
    const delayed = [];
    for await (const task of dw.tasks({ topic, state: "delayed" })) delayed.push(task.id);
    assert.equal(delayed.length, 25);
    const one = await dw.listPage({ topic, limit: 1 });
    assert.equal(one.tasks.length, 1);
    assert.notEqual(one.next, null);
  });

  test("release, max attempts, dead, kick and kickTask", async () => {
    const topic = unique("dead");
    const { id } = await dw.add(topic, "x", { maxAttempts: 1 });
    const first = await dw.reserve([topic], 1);
    assert.equal(first.id, id);
    assert.equal(await dw.release(id, 0), true);
    assert.equal((await dw.get(id)).state, "dead");
    assert.equal(await dw.kick(topic, 10), 1);
    assert.equal((await dw.get(id)).state, "ready");
    await dw.reserve(topic, 1);
    await dw.release(id);
    assert.equal((await dw.get(id)).state, "dead");
    assert.equal(await dw.kickTask(id), true);
    const again = await dw.get(id);
    assert.equal(again.state, "ready");
    assert.equal(again.attempts, 0);
    // release with a delay puts it back delayed
    const other = unique("release");
    const { id: later } = await dw.add(other, "y");
    assert.equal((await dw.reserve(other, 1)).id, later);
    assert.equal(await dw.release(later, 3600), true);
    assert.equal((await dw.get(later)).state, "delayed");
  });

  test("stats and cluster", async () => {
    const topic = unique("stats");
    await dw.add(topic, 1, { delay: 60 });
    const stats = await dw.stats();
    assert.equal(typeof stats.version, "string");
    assert.equal(stats.topics[topic].delayed, 1);
    assert.ok(stats.tasks >= 1);
    const map = await dw.cluster();
    assert.equal(map.partitions, 1);
    assert.equal(map.owners[0].partition, 0);
  });

  test("the schedule methods", async () => {
    const id = unique("sched");
    const topic = unique("sched-topic");
    const saved = await dw.scheduleAdd({ id, every: 3600, topic, body: { n: 1 } });
    assert.equal(saved.id, id);
    assert.equal(saved.paused, false);
    assert.equal((await dw.scheduleGet(id)).id, id);
    const updated = await dw.scheduleUpdate(id, { body: { n: 2 } }, saved.version);
    assert.deepEqual(updated.body, { n: 2 });
    await assert.rejects(dw.scheduleUpdate(id, { body: 3 }, saved.version), Conflict);
    const paused = await dw.schedulePause(id, "maintenance");
    assert.equal(paused.paused, true);
    assert.equal(paused.next, null);
    const resumed = await dw.scheduleResume(id);
    assert.equal(resumed.paused, false);
    const next = await dw.scheduleNext({ every: 60 }, 3);
    assert.equal(next.times.length, 3);
    assert.equal(typeof next.description, "string");
    assert.equal((await dw.scheduleNext(id, 2)).times.length, 2);
    const triggered = await dw.scheduleTrigger(id);
    assert.ok(triggered.id.startsWith(`s:${id}:`));
    const task = await dw.get(triggered.id);
    assert.equal(task.schedule, id);
    const now = Date.now() / 1000;
    const backfilled = await dw.scheduleBackfill(id, now - 3 * 3600, now);
    assert.ok(Array.isArray(backfilled.ids));
    assert.equal(typeof backfilled.existing, "number");
    const pages = [];
    for await (const page of dw.scheduleList({ topic, limit: 1 })) pages.push(...page.schedules.map((s) => s.id));
    assert.deepEqual(pages, [id]);
    assert.equal((await dw.scheduleListPage({ topic })).schedules.length, 1);
    assert.equal(await dw.scheduleDelete(id), true);
    assert.equal(await dw.scheduleDelete(id), false);
    assert.equal(await dw.scheduleGet(id), null);
  });

  test("the topic methods: settings with retain and dead_retain", async () => {
    const topic = unique("settings");
    const fresh = await dw.topicGet(topic);
    assert.equal(fresh.dead_retain, null);
    assert.equal(fresh.retain, 0);
    const set = await dw.topicSet(topic, { rate: 5, burst: 2, retain: 60, dead_retain: 3600, note: "n" });
    assert.deepEqual([set.rate, set.burst, set.retain, set.dead_retain], [5, 2, 60, 3600]);
    assert.equal((await dw.topicGet(topic)).dead_retain, 3600);
    const listed = (await dw.topicList({ limit: 1000 })).topics;
    assert.ok(listed.some((t) => t.topic === topic && t.dead_retain === 3600));
    const back = await dw.topicSet(topic, { rate: null, burst: null, retain: null, dead_retain: null, note: null });
    assert.equal(back.dead_retain, null);
    await assert.rejects(dw.topicSet(topic, { dead_retain: -1 }), BadRequest);
  });

  test("errors are classes with the protocol's codes", async () => {
    const topic = unique("errors");
    await assert.rejects(dw.ack("no-such-task"), (exc) => exc instanceof NotFound && exc.code === "not_found");
    const { id } = await dw.add(topic, 1, { id: unique("e"), delay: 60 });
    await assert.rejects(dw.add(topic, 1, { id }), (exc) => exc instanceof Exists && exc.message.includes(id));
    await assert.rejects(dw.ack(id), (exc) => exc instanceof Conflict && /delayed/.test(exc.message));
    await assert.rejects(
      dw.add(topic, 1, { delay: -5 }),
      (exc) => exc instanceof BadRequest && exc instanceof DelaywheelError && exc.message.includes("-5"),
    );
    await assert.rejects(dw.call("no_such_method"), (exc) => exc instanceof NoMethod);
    await assert.rejects(dw.add(topic, 10n), (exc) => exc instanceof DelaywheelError && /encode/.test(exc.message));
    assert.equal(await dw.ping(), "pong", "the connection survives every error above");
  });

  test("many requests in flight on one connection", async () => {
    const topic = unique("pipeline");
    const count = 5000;
    const calls = Array.from({ length: count }, (_, n) => dw.add(topic, n, { delay: 600 }));
    await new Promise((resolve) => setImmediate(resolve)); // the requests are written
    assert.ok(dw.inFlight > 100, `only ${dw.inFlight} requests were in flight at once`);
    const results = await Promise.all(calls);
    assert.equal(new Set(results.map((r) => r.id)).size, count);
    const got = await Promise.all(results.map((r) => dw.get(r.id)));
    assert.deepEqual(got.map((t) => t.body), Array.from({ length: count }, (_, n) => n));
  });

  test("a blocking reserve is answered after later requests", async () => {
    const topic = unique("late");
    const waiting = dw.reserve(topic, 10);
    const pong = await dw.ping();
    assert.equal(pong, "pong");
    const { id } = await dw.add(topic, "now");
    const task = await waiting;
    assert.equal(task.id, id);
    await dw.ack(id);
  });
});

test("a body over the server's limit is TooLarge; a message over it closes the connection", async () => {
  const server = await Server.start(["--max-body", "1000", "--max-message", "100000"]);
  const dw = new Client({ host: server.host, port: server.port });
  try {
    await assert.rejects(dw.add("big", Buffer.alloc(5000)), TooLarge);
    await assert.rejects(
      dw.add("huge", Buffer.alloc(200_000)),
      (exc) => exc instanceof ServerClosed && exc.code === "too_large",
    );
    assert.equal(await dw.ping(), "pong", "the next call opens a new connection");
  } finally {
    dw.close();
    await server.stop();
  }
});

test("the client reconnects after a server restart", async () => {
  const dir = tempDir();
  const server = await Server.start([], { store: `sqlite:///${path.join(dir, "tasks.db")}` });
  // Retries whose backoffs add up to about 16 s: room for a server that starts slowly under load.
  const dw = new Client(`delaywheel://${server.host}:${server.port}`, { retries: 20 });
  try {
    const { id } = await dw.add("restart", { kept: true }, { delay: 600 });
    await server.restart();
    // The old connection is gone: the next read opens a new one (retrying with backoff).
    const task = await dw.get(id);
    assert.deepEqual(task.body, { kept: true });
    // A write on a connection that is gone before it is sent is retried as well.
    await server.stop();
    const pending = dw.add("restart", "while down", { id: "while-down" });
    setTimeout(() => server.start(), 100);
    await assert.doesNotReject(pending);
    assert.equal((await dw.get("while-down")).body, "while down");
  } finally {
    dw.close();
    await server.stop();
    removeDir(dir);
  }
});

test("a closed client fails at once", async () => {
  const server = await Server.start();
  // Retried, its backoffs alone would add up to over 4 s.
  const dw = new Client({ host: server.host, port: server.port, retries: 10 });
  try {
    assert.equal(await dw.ping(), "pong");
    dw.close();
    const started = Date.now();
    await assert.rejects(dw.ping(), (exc) => exc instanceof ConnectionFailed && /closed/.test(exc.message));
    assert.ok(Date.now() - started < 1000, "not retried");
  } finally {
    await server.stop();
  }
});

test("a server that is not there is ConnectionFailed, after the retries", async () => {
  const dw = new Client({ host: "127.0.0.1", port: 1, retries: 1 });
  await assert.rejects(dw.ping(), (exc) => exc instanceof ConnectionFailed && exc.message.includes("127.0.0.1:1"));
  dw.close();
});
