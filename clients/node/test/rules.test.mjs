// The cluster client's retry rules and partition map, decision by decision against the
// Python client's own (delaywheel_client/retry.py, routing.py), which they must match.
import assert from "node:assert/strict";
import { test } from "node:test";

import { Retry, retryAfterS } from "../dist/retry.js";
import { PartitionMap, route } from "../dist/routing.js";
import { ConnectionFailed, ServerClosed, errorFrom } from "../dist/errors.js";
import { python } from "./servers.mjs";

// A partition moving between nodes: the old owner names the new one before it serves, so
// both may answer moved for a while.
const MOVING = Array.from({ length: 40 }, (_, n) => ["moved", { partition: 3, owner: n % 2 ? "a:1" : "b:1", epoch: 5 }]);

// Each scenario: a method, whether its first send was already a resend, and what it meets
// in turn: [code, data] for a server error, ["connection", applied] for a lost
// connection, ["closed", code] for ServerClosed, ["progressed", null] for part of the call
// getting through (one owner's batch of an add_many). The clock starts at 1000 s and moves
// on by each wait decided; the deadline is 30 s on, or already past.
const SCENARIOS = [
  ["get", false, [["moved", { partition: 1, owner: "b:1", epoch: 2 }], ["moved", {}], ["moved", {}], ["moved", {}]]],
  ["ack", false, [["tryagain", { partition: 1, retry_after_ms: 200 }], ["tryagain", { retry_after_ms: 0 }], ["tryagain", {}]]],
  ["ack", false, [["connection", false], ["connection", false], ["connection", false], ["connection", false], ["connection", false]]],
  ["ack", false, [["connection", true]]],
  ["add", false, [["connection", true], ["unavailable", null], ["connection", true], ["unavailable", null]]],
  ["add_many", false, [["unavailable", null], ["exists", null]]],
  ["delete", false, [["unavailable", null]]],
  ["get", false, [["unavailable", null], ["unavailable", null], ["unavailable", null], ["unavailable", null]]],
  ["add", false, [["exists", null]]],
  ["add", true, [["exists", null]]],
  ["add", false, [["moved", {}], ["exists", null]]],
  ["update", true, [["exists", null]]],
  ["ack", false, [["closed", "unavailable"], ["closed", "too_large"]]],
  ["ack", false, [["not_found", null]]],
  ["ack", false, [["conflict", null]]],
  ["ack", false, [["moved", {}], ["tryagain", {}], ["moved", {}], ["moved", {}], ["moved", {}]]],
  // Moved until the deadline: at once 3 times, then backing off to 1 s, then thrown.
  ["get", false, MOVING],
  ["ack", false, MOVING.slice(0, 9)],
  // A batch that got through starts the count again; tryagain's waits are counted apart.
  ["add_many", false, [...MOVING.slice(0, 5), ["progressed", null], ...MOVING.slice(0, 5), ["tryagain", {}], ["moved", {}]]],
  ["add", false, [["tryagain", { retry_after_ms: 29_900 }], ...MOVING.slice(0, 6)]],
  ["add", false, [...MOVING.slice(0, 6), ["exists", null]]],
];
const PAST = "past";

function nodeError([kind, detail]) {
  if (kind === "connection") return new ConnectionFailed("lost", undefined, undefined, detail);
  if (kind === "closed") return new ServerClosed("closed", detail, undefined, true);
  return errorFrom(kind, "message", detail ?? undefined);
}

// Each decision as [action, wait in seconds]: the waits are compared as the same doubles.
function nodeDecisions(deadline) {
  return SCENARIOS.map(([method, resent, errors]) => {
    let now = 1000;
    const retry = new Retry(method, deadline === PAST ? now - 1 : now + 30, resent);
    return errors.map(([kind, detail]) => {
      if (kind === "progressed") {
        retry.progressed();
        return ["progressed", 0];
      }
      const step = retry.after(nodeError([kind, detail]), now);
      const waitS = step.action === "resend" ? step.waitS : 0;
      now += waitS;
      return [step.action, waitS];
    });
  });
}

function pythonDecisions(deadline) {
  const out = python(
    `import json, sys
from delaywheel_client.errors import ConnectionFailed, ServerClosed, error_from
from delaywheel_client.retry import Retry
scenarios, past = json.loads(sys.argv[1]), sys.argv[2] == "past"
def error(kind, detail):
    if kind == "connection":
        exc = ConnectionFailed("lost")
        exc.maybe_applied = detail
        return exc
    if kind == "closed":
        return ServerClosed("closed", detail)
    return error_from(kind, "message", detail)
found = []
for method, resent, errors in scenarios:
    now = 1000.0
    retry = Retry(method, now - 1 if past else now + 30, resent)
    steps = []
    for kind, detail in errors:
        if kind == "progressed":
            retry.progressed()
            steps.append(["progressed", 0])
            continue
        step = retry.after(error(kind, detail), now)
        now += step.wait_s
        steps.append([step.action, step.wait_s])
    found.append(steps)
print(json.dumps(found))`,
    [JSON.stringify(SCENARIOS), deadline],
  );
  return JSON.parse(out);
}

test("Retry decides as the Python client's Retry, before and after the deadline", () => {
  for (const deadline of ["future", PAST]) {
    const python = pythonDecisions(deadline);
    const node = nodeDecisions(deadline);
    SCENARIOS.forEach((scenario, n) => assert.deepEqual(node[n], python[n], `${deadline}: ${JSON.stringify(scenario)}`));
  }
});

test("moved is followed until the deadline: at once 3 times, then after 0.1, 0.2, 0.4, 0.8, 1 s...", () => {
  const start = 1000;
  const retry = new Retry("get", start + 30);
  let now = start;
  const waits = [];
  let thrown = false;
  for (const error of MOVING) {
    const step = retry.after(nodeError(error), now);
    if (step.action !== "resend") {
      assert.equal(step.action, "raise");
      thrown = true;
      break;
    }
    assert.deepEqual(step.hint, error[1], "the hint is the moved error's data");
    waits.push(step.waitS);
    now += step.waitS;
  }
  assert.ok(thrown, `still followed after ${MOVING.length} moves`);
  assert.deepEqual(waits.slice(0, 8), [0, 0, 0, 0.1, 0.2, 0.4, 0.8, 1]);
  assert.ok(waits.length >= 30, `${waits.length} follows before the deadline`);
  assert.ok(Math.abs(now - (start + 30)) < 1e-9, `thrown at ${now - start} s, not at the 30 s deadline`);
  assert.ok(waits.every((waitS) => waitS <= 1), waits.join(", "));
  const past = new Retry("get", start - 1);
  assert.equal(past.after(nodeError(MOVING[0]), start).action, "raise", "past the deadline: thrown at once");
});

test("the waits: tryagain's retry_after_ms, else 50 ms doubling to 1 s", () => {
  const tryagain = errorFrom("tryagain", "m", { retry_after_ms: 250 });
  assert.equal(retryAfterS(tryagain, 0), 0.25);
  const lost = new ConnectionFailed("lost");
  assert.deepEqual([0, 1, 2, 3, 4, 5, 9].map((n) => retryAfterS(lost, n)), [0.05, 0.1, 0.2, 0.4, 0.8, 1, 1]);
});

test("the map from cluster, and a moved hint taken into a new map", () => {
  const raw = {
    node: "a",
    partitions: 4,
    lease_s: 10,
    owners: [
      { partition: 0, node: "a", address: "h:1", epoch: 1 },
      { partition: 1, node: "b", address: "h:2", epoch: 1 },
      { partition: 2, node: null, address: null, epoch: 0 },
      { partition: 9, node: "x", address: "h:9", epoch: 1 },
    ],
  };
  const pmap = PartitionMap.fromCluster(raw, "h:1");
  assert.deepEqual(pmap.owners, ["h:1", "h:2", null, null]);
  assert.deepEqual(pmap.nodes(), ["h:1", "h:2"]);
  const followed = pmap.followed({ partition: 2, owner: "h:3", epoch: 4 });
  assert.deepEqual(followed.owners, ["h:1", "h:2", "h:3", null]);
  assert.deepEqual(pmap.owners, ["h:1", "h:2", null, null], "the old map is unchanged");
  assert.equal(pmap.followed({ partition: 7, owner: "h:3" }), pmap, "a partition the map has not");
  assert.equal(pmap.followed({ partition: 1, owner: null }), pmap, "no owner named");
  assert.throws(() => PartitionMap.fromCluster({ partitions: 0 }, "h:1"), /partitions 0/);
  assert.deepEqual(PartitionMap.single("h:5").owners, ["h:5"]);
});

test("each method is routed by the param the Python client's commands.py names", () => {
  const out = python(`import json
from delaywheel_client.commands import SPECS
from delaywheel_client.routing import route
samples = [["task-id", {"id": "in-map"}], [{"id": "in-map"}, "second"], []]
print(json.dumps({spec.name: [route(spec.name, p) for p in samples] for spec in SPECS}))`);
  const expected = JSON.parse(out);
  const samples = [["task-id", { id: "in-map" }], [{ id: "in-map" }, "second"], []];
  assert.ok(Object.keys(expected).length >= 25, Object.keys(expected).join(", "));
  for (const [method, routes] of Object.entries(expected)) {
    assert.deepEqual(samples.map((params) => route(method, params) ?? null), routes, method);
  }
});

test("every method of the protocol is a method of Client and ClusterClient", async () => {
  const { Client, ClusterClient } = await import("delaywheel-client");
  const names = JSON.parse(python(`import json
from delaywheel_client.commands import SPECS
print(json.dumps([spec.name for spec in SPECS]))`));
  // auth is sent by the connection itself, first, when the client has a token.
  const methods = names.filter((name) => name !== "auth");
  assert.ok(methods.includes("schedule_backfill") && methods.includes("kick_task"), names.join(", "));
  for (const name of methods) {
    const camel = name.replace(/_([a-z])/g, (_, letter) => letter.toUpperCase());
    for (const cls of [Client, ClusterClient]) {
      assert.equal(typeof cls.prototype[camel], "function", `${cls.name}.${camel} (${name})`);
    }
  }
});
