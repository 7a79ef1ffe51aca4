// Bodies across the HTTP API and this client: a task added from Node reads the same over
// HTTP (/v1, JSON; bytes base64'd with body_encoding), and one added over HTTP reads the
// same from Node. The Python client's side of it is tests/test_httpapi.py's.
import assert from "node:assert/strict";
import { test } from "node:test";

import { decode } from "@msgpack/msgpack";
import { serverAndClient, unique } from "./servers.mjs";

// One body of each kind, as Node holds it.
const KINDS = {
  bytes: Buffer.from([0, 1, 2, 255]),
  str: "héllo 🙂",
  int: -42,
  float: 1.5,
  map: { a: 1, b: [1, "x"], c: { d: null } },
  list: [1, "two", null, true],
  nested_bytes: [1, Buffer.from("raw")], // no JSON form: body_encoding msgpack
  nil: null,
  bool: false,
};

let dw;
let api;
serverAndClient(
  (server, client) => {
    [dw, api] = [client, server.apiUrl];
  },
  ["--api-port", "0"],
);

function fromJson(task) {
  if (task.body_encoding === "base64") return Buffer.from(task.body, "base64");
  if (task.body_encoding === "msgpack") return decode(Buffer.from(task.body, "base64"));
  return task.body;
}

function same(got, want, what) {
  // bin comes back as a Uint8Array: compare its bytes.
  const norm = (value) =>
    value instanceof Uint8Array
      ? Buffer.from(value)
      : Array.isArray(value)
        ? value.map(norm)
        : value;
  assert.deepEqual(norm(got ?? null), norm(want), what);
}

test("a task added from Node reads the same over HTTP", async () => {
  const topic = unique("node-to-http");
  for (const [kind, body] of Object.entries(KINDS)) {
    const { id } = await dw.add(topic, body);
    const reply = await fetch(`${api}/tasks/${encodeURIComponent(id)}`);
    assert.equal(reply.status, 200);
    same(fromJson(await reply.json()), body, `the ${kind} body`);
  }
});

test("a task added over HTTP reads the same from Node", async () => {
  const topic = unique("http-to-node");
  const sent = {
    bytes: [{ body: Buffer.from([0, 1, 2, 255]).toString("base64"), body_encoding: "base64" }, KINDS.bytes],
    str: [{ body: KINDS.str }, KINDS.str],
    int: [{ body: -42 }, -42],
    map: [{ body: KINDS.map }, KINDS.map],
    list: [{ body: KINDS.list }, KINDS.list],
    nil: [{ body: null }, null],
  };
  for (const [kind, [fields, body]] of Object.entries(sent)) {
    const reply = await fetch(`${api}/tasks`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ topic, ...fields }),
    });
    assert.equal(reply.status, 201, await reply.clone().text());
    const { id } = await reply.json();
    same((await dw.get(id)).body, body, `the ${kind} body`);
  }
});
