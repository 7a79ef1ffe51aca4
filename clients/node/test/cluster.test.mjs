// ClusterClient on two real nodes sharing a private redis-server's keyspace.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Client, ClusterClient, Moved, PartitionMap, partitionOf } from "delaywheel-client";
import { RedisServer, Server, freePort, python, removeDir, tempDir, unique, waitUntil } from "./servers.mjs";

const PARTITIONS = 16;
const LEASE_S = "3"; // long enough that a loaded machine does not make a node lose a lease

test("the partition rule is the Python client's, occurrence ids included", () => {
  const ids = [
    "a", "task-1", "émoji-🙂", "s:daily:1700000000", "s:a:b:123", "s:x:", "s:x:12a", "s:x:12.",
    "s:x:12.5", "s::123", "s:only", "S:x:1", "s:x:٣", "0123456789abcdef0123456789abcdef",
  ];
  const counts = [1, 7, 16, 1000];
  const code = `
import json, sys
from delaywheel_client.partitions import partition_of
ids = json.loads(sys.argv[1])
print(json.dumps([[partition_of(i, n) for n in ${JSON.stringify(counts)}] for i in ids]))`;
  const expected = JSON.parse(python(code, [JSON.stringify(ids)]));
  const got = ids.map((id) => counts.map((n) => partitionOf(id, n)));
  assert.deepEqual(got, expected);
});

describe("two nodes", () => {
  let dir;
  let redis;
  let nodes;
  let addresses;
  let dw;

  before(async () => {
    dir = tempDir();
    redis = await RedisServer.start(dir);
    nodes = [];
    for (const name of ["a", "b"]) {
      const port = await freePort();
      nodes.push(await Server.start(["--port", String(port), "--node", name, "--lease", LEASE_S], { store: redis.url }));
    }
    addresses = nodes.map((node) => node.address).sort();
    // Settled: each node's map names both nodes and every partition has an owner.
    await waitUntil(
      async () => {
        for (const node of nodes) {
          const plain = new Client({ host: node.host, port: node.port });
          try {
            const map = await plain.cluster();
            const owners = map.owners.map((o) => o.address);
            if (owners.length !== PARTITIONS || owners.includes(null)) return false;
            if ([...new Set(owners)].sort().join() !== addresses.join()) return false;
          } finally {
            plain.close();
          }
        }
        return true;
      },
      30_000,
      "two nodes sharing the partitions",
    );
    dw = new ClusterClient(addresses.join(","));
  });

  after(async () => {
    dw?.close();
    for (const node of nodes ?? []) await node.stop();
    await redis?.stop();
    removeDir(dir);
  });

  test("each call goes to its task's owner", async () => {
    const topic = unique("owners");
    const added = await Promise.all(Array.from({ length: 40 }, (_, n) => dw.add(topic, n, { delay: 600 })));
    const pmap = await dw.partitionMap();
    assert.deepEqual(pmap.nodes(), addresses);
    const owners = new Set();
    for (const { id } of added) {
      const owner = pmap.ownerOf(id);
      owners.add(owner);
      const other = addresses.find((a) => a !== owner);
      const [host, port] = owner.split(":");
      const atOwner = new Client({ host, port: Number(port) });
      const [ohost, oport] = other.split(":");
      const atOther = new Client({ host: ohost, port: Number(oport) });
      try {
        assert.equal((await atOwner.get(id)).id, id);
        await assert.rejects(atOther.get(id), (exc) => exc instanceof Moved && exc.data.owner === owner
          && exc.data.partition === partitionOf(id, PARTITIONS));
      } finally {
        atOwner.close();
        atOther.close();
      }
      assert.equal((await dw.get(id)).topic, topic);
    }
    assert.equal(owners.size, 2, "40 ids fall on both nodes");
  });

  test("moved is followed from a stale map", async () => {
    const topic = unique("moved");
    const { id } = await dw.add(topic, "followed", { delay: 600 });
    const real = await dw.partitionMap();
    const owner = real.ownerOf(id);
    const wrong = addresses.find((a) => a !== owner);
    const stale = new ClusterClient(addresses);
    try {
      // Every partition said to be the wrong node's: the first answer is moved.
      await stale.partitionMap();
      stale.map = new PartitionMap(PARTITIONS, Array(PARTITIONS).fill(wrong), real.raw);
      assert.equal((await stale.get(id)).body, "followed");
      assert.equal((await stale.partitionMap()).ownerOf(id), owner, "the map was fetched again");
      stale.map = new PartitionMap(PARTITIONS, Array(PARTITIONS).fill(wrong), real.raw);
      const results = await stale.addMany(Array.from({ length: 20 }, (_, n) => ({ topic, body: n, delay: 600 })));
      assert.equal(results.length, 20);
      for (const [n, result] of results.entries()) assert.equal((await dw.get(result.id)).body, n);
      stale.map = new PartitionMap(PARTITIONS, Array(PARTITIONS).fill(wrong), real.raw);
      assert.equal(await stale.delete(id), true);
    } finally {
      stale.close();
    }
  });

  test("addMany goes to each owner; reserve, list, stats, kick and ping visit every node", async () => {
    const topic = unique("spread");
    const tasks = Array.from({ length: 30 }, (_, n) => ({ topic, body: { n } }));
    const results = await dw.addMany(tasks);
    assert.equal(results.length, 30);
    const pmap = await dw.partitionMap();
    assert.equal(new Set(results.map((r) => pmap.ownerOf(r.id))).size, 2);
    const listed = [];
    for await (const page of dw.list({ topic, limit: 7 })) listed.push(...page.tasks.map((t) => t.body.n));
    assert.deepEqual(listed.sort((a, b) => a - b), Array.from({ length: 30 }, (_, n) => n));
    const stats = await dw.stats();
    assert.deepEqual(Object.keys(stats.nodes).sort(), addresses);
    assert.ok(stats.tasks >= 30);
    assert.equal(await dw.ping(), "pong");
    const seen = new Set();
    for (let n = 0; n < 30; n++) {
      const task = await dw.reserve(topic, 5);
      assert.notEqual(task, null, `reserve ${n} found nothing`);
      seen.add(task.body.n);
      assert.equal(await dw.ack(task.id), true);
    }
    assert.equal(seen.size, 30);
    assert.equal(await dw.reserve(topic), null);
    // Dead tasks on both nodes: kick visits each node until its count is reached.
    const doomed = await dw.addMany(Array.from({ length: 8 }, (_, n) => ({ topic, body: n, max_attempts: 1 })));
    assert.equal(new Set(doomed.map((r) => pmap.ownerOf(r.id))).size, 2);
    for (let n = 0; n < 8; n++) await dw.release((await dw.reserve(topic, 5)).id);
    const dead = [];
    for await (const task of dw.tasks({ topic, state: "dead" })) dead.push(task.id);
    assert.equal(dead.length, 8);
    assert.equal(await dw.kick(topic, 100), 8);
    assert.equal((await dw.get(doomed[0].id)).state, "ready");
    const map = await dw.cluster();
    assert.equal(map.partitions, PARTITIONS);
  });

  // Last: it stops a node.
  test("a node that stops: its partitions' calls wait for the takeover, then go through", async () => {
    const topic = unique("failover");
    const pmap = await dw.partitionMap();
    const gone = nodes.find((node) => node.address === addresses[1]);
    const kept = nodes.find((node) => node.address === addresses[0]);
    // Tasks on the node about to stop, kept there durably (Redis).
    const onGone = [];
    for (let n = 0; onGone.length < 3; n++) {
      const id = `${topic}-${n}`;
      if (pmap.ownerOf(id) === gone.address) onGone.push((await dw.add(topic, n, { id, delay: 600 })).id);
    }
    await gone.stop();
    const started = Date.now();
    // Refused connections, then tryagain or moved while the lease runs out: waited out.
    const task = await dw.get(onGone[0]);
    assert.equal(task.id, onGone[0]);
    assert.equal((await dw.partitionMap()).ownerOf(onGone[0]), kept.address);
    assert.deepEqual((await dw.partitionMap()).nodes(), [kept.address]);
    for (const id of onGone) assert.equal(await dw.delete(id), true);
    const added = await dw.add(topic, "after");
    assert.equal((await dw.get(added.id)).body, "after");
    assert.ok(Date.now() - started < 30_000);
  });

  // After the stop above: the map names one node.
  test("a node that comes back: reserve asks it once the map is older than MAP_MAX_AGE_S", async () => {
    const topic = unique("back");
    const gone = nodes.find((node) => node.address === addresses[1]);
    assert.deepEqual((await dw.partitionMap()).nodes(), [addresses[0]]);
    await gone.start(); // on its port (--port given): the same address
    let fresh;
    await waitUntil(
      async () => {
        const plain = new Client({ host: gone.host, port: gone.port });
        try {
          fresh = PartitionMap.fromCluster(await plain.cluster(), gone.address);
          return fresh.nodes().join() === addresses.join();
        } finally {
          plain.close();
        }
      },
      30_000,
      "the node serving its share again",
    );
    let id;
    for (let n = 0; id === undefined; n++) if (fresh.ownerOf(`${topic}-${n}`) === gone.address) id = `${topic}-${n}`;
    const direct = new Client({ host: gone.host, port: gone.port });
    try {
      await direct.add(topic, "on the node back", { id });
    } finally {
      direct.close();
    }
    // Nothing answers a reserve moved: the map is fetched again for its age alone.
    const task = await dw.reserve(topic, 15);
    assert.equal(task?.id, id);
    assert.deepEqual((await dw.partitionMap()).nodes(), addresses);
  });
});
