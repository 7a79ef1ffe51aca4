// The cluster client's retry rules and partition map, decision by decision against the
// Python client's own (delaywheel_client/retry.py, routing.py), which they must match.
import assert from "node:assert/strict";
import { test } from "node:test";

import { Retry, retryAfterS } from "../dist/retry.js";
import { PartitionMap, route } from "../dist/routing.js";
import { ConnectionFailed, ServerClosed, errorFrom } from "../dist/errors.js";
import { python } from "./servers.mjs";

// Each scenario: a method, whether its first send was already a resend, and the errors
// it meets in turn: [code, data] for a server error, ["connection", applied] for a lost
// connection, ["closed", code] for ServerClosed. The deadline is far, or already past.
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
];
const PAST = "past";

function nodeError([kind, detail]) {
  if (kind === "connection") return new ConnectionFailed("lost", undefined, undefined, detail);
  if (kind === "closed") return new ServerClosed("closed", detail, undefined, true);
  return errorFrom(kind, "message", detail ?? undefined);
}

function nodeDecisions(deadline) {
  return SCENARIOS.map(([method, resent, errors]) => {
    const now = 1000;
    const retry = new Retry(method, deadline === PAST ? now - 1 : now + 30, resent);
    return errors.map((error) => {
      const step = retry.after(nodeError(error), now);
      return [step.action, Math.round((step.waitS ?? 0) * 1e6)];
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
        step = retry.after(error(kind, detail), now)
        steps.append([step.action, round(step.wait_s * 1e6)])
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
