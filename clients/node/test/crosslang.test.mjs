// Bodies across languages: a task added from Node is read by the Python client, one
// added from Python is read here, and a body read here and added again reads the same
// in Python. The Python side is the repository's client, run in a subprocess.
import assert from "node:assert/strict";
import { test } from "node:test";

import { python, serverAndClient, unique } from "./servers.mjs";

// One body of each kind, as Node holds it and as Python's repr shows it.
const KINDS = {
  bytes: [Buffer.from([0, 1, 2, 255]), "b'\\x00\\x01\\x02\\xff'"],
  str: ["héllo 🙂", "'héllo 🙂'"],
  int: [-42, "-42"],
  bigint: [2 ** 40, "1099511627776"],
  float: [1.5, "1.5"],
  map: [{ a: 1, b: [1, "x"], c: { d: null } }, "{'a': 1, 'b': [1, 'x'], 'c': {'d': None}}"],
  list: [[1, "two", null, Buffer.from("raw"), true], "[1, 'two', None, b'raw', True]"],
  nil: [null, "None"],
  bool: [false, "False"],
};

// The same bodies written in Python.
const PYTHON_BODIES = `{
  "bytes": b"\\x00\\x01\\x02\\xff", "str": "héllo 🙂", "int": -42, "bigint": 2**40, "float": 1.5,
  "map": {"a": 1, "b": [1, "x"], "c": {"d": None}}, "list": [1, "two", None, b"raw", True],
  "nil": None, "bool": False,
}`;

let server;
let dw;
serverAndClient((started, client) => {
  [server, dw] = [started, client];
});

const CONNECT = (port) => `from delaywheel_client import Client\ndw = Client("127.0.0.1", ${port})\n`;

test("a task added from Node reads the same in Python", async () => {
  const topic = unique("node-to-python");
  const ids = {};
  for (const [kind, [body]] of Object.entries(KINDS)) ids[kind] = (await dw.add(topic, body)).id;
  const out = python(
    `${CONNECT(server.port)}import json, sys
ids = json.loads(sys.argv[1])
print(json.dumps({kind: repr(dw.get(i)["body"]) for kind, i in ids.items()}))`,
    [JSON.stringify(ids)],
  );
  const seen = JSON.parse(out);
  for (const [kind, [, repr]] of Object.entries(KINDS)) assert.equal(seen[kind], repr, `the ${kind} body`);
});

test("a task added from Python reads the same in Node, and back", async () => {
  const topic = unique("python-to-node");
  const out = python(
    `${CONNECT(server.port)}import json
bodies = ${PYTHON_BODIES}
print(json.dumps({kind: dw.add(${JSON.stringify(topic)}, body)["id"] for kind, body in bodies.items()}))`,
  );
  const ids = JSON.parse(out);
  const again = {};
  for (const [kind, [body]] of Object.entries(KINDS)) {
    const task = await dw.get(ids[kind]);
    const got = task.body ?? null;
    if (kind === "bytes") {
      assert.ok(got instanceof Uint8Array, `bin is a Uint8Array, got ${typeof got}`);
      assert.deepEqual(Buffer.from(got), body);
    } else if (kind === "list") {
      assert.ok(got[3] instanceof Uint8Array);
      assert.deepEqual([...got.slice(0, 3), Buffer.from(got[3]), got[4]], body);
    } else {
      assert.deepEqual(got, body, `the ${kind} body`);
    }
    // Read here, added again from here: Python must see what it wrote.
    again[kind] = (await dw.add(topic, got)).id;
  }
  const check = python(
    `${CONNECT(server.port)}import json, sys
bodies = ${PYTHON_BODIES}
ids = json.loads(sys.argv[1])
print(json.dumps({kind: dw.get(i)["body"] == bodies[kind] and type(dw.get(i)["body"]) is type(bodies[kind])
                  for kind, i in ids.items()}))`,
    [JSON.stringify(again)],
  );
  const same = JSON.parse(check);
  for (const kind of Object.keys(KINDS)) assert.equal(same[kind], true, `the ${kind} body back in Python`);
});
