// The Node client's `add` beside the Python client's, against one server:
// one call at a time, and pipelined (batches of BATCH calls in flight at once on one
// connection; the Python client's pipeline() sends each batch in one write).
//
//   npm run build && node bench/add.mjs [--store memory://] [--sequential N] [--pipelined N]
//
// It starts `delaywheel serve` (the repository's Python, as the tests do), runs each
// client in turn, Python in a subprocess, and prints adds per second and µs per add.
import { parseArgs } from "node:util";

import { Client } from "delaywheel-client";
import { Server, python } from "../test/servers.mjs";

const { values } = parseArgs({
  options: {
    store: { type: "string", default: "memory://" },
    sequential: { type: "string", default: "5000" },
    pipelined: { type: "string", default: "50000" },
    batch: { type: "string", default: "1000" },
  },
});
const SEQUENTIAL = Number(values.sequential);
const PIPELINED = Number(values.pipelined);
const BATCH = Number(values.batch);
const BODY = { to: "a@example.com", n: 1 };

const WARM_UP = 2000; // calls each client makes before it is timed (JIT, the server's caches)

async function nodeRuns(server) {
  const dw = new Client({ host: server.host, port: server.port });
  for (let n = 0; n < WARM_UP; n++) await dw.add("bench-warm-up", BODY, { delay: 3600 });
  let started = performance.now();
  for (let n = 0; n < SEQUENTIAL; n++) await dw.add("bench-node-seq", BODY, { delay: 3600 });
  const sequentialS = (performance.now() - started) / 1000;
  started = performance.now();
  for (let done = 0; done < PIPELINED; done += BATCH) {
    const calls = [];
    for (let n = 0; n < Math.min(BATCH, PIPELINED - done); n++) calls.push(dw.add("bench-node-pipe", BODY, { delay: 3600 }));
    await Promise.all(calls);
  }
  const pipelinedS = (performance.now() - started) / 1000;
  dw.close();
  return { sequentialS, pipelinedS };
}

function pythonRuns(server) {
  const out = python(`
import json, time
from delaywheel_client import Client
body = ${JSON.stringify(BODY)}
with Client(${JSON.stringify(server.host)}, ${server.port}) as dw:
    for _ in range(${WARM_UP}):
        dw.add("bench-warm-up", body, delay=3600)
    started = time.perf_counter()
    for _ in range(${SEQUENTIAL}):
        dw.add("bench-py-seq", body, delay=3600)
    sequential_s = time.perf_counter() - started
    started = time.perf_counter()
    for done in range(0, ${PIPELINED}, ${BATCH}):
        with dw.pipeline() as pipe:
            for _ in range(min(${BATCH}, ${PIPELINED} - done)):
                pipe.add("bench-py-pipe", body, delay=3600)
    pipelined_s = time.perf_counter() - started
print(json.dumps({"sequentialS": sequential_s, "pipelinedS": pipelined_s}))
`);
  return JSON.parse(out);
}

function row(name, count, seconds) {
  const rate = Math.round(count / seconds).toLocaleString("en-US").padStart(9);
  const each = ((seconds / count) * 1e6).toFixed(1).padStart(8);
  return `${name.padEnd(30)} ${String(count).padStart(7)} ${rate} /s ${each} µs`;
}

const server = await Server.start([], { store: values.store, tick: null });
try {
  // Python, Node, Python, Node: each figure is the better of its two runs, so neither
  // client is the one that met a cold server or a busy moment alone.
  const runs = { node: [], py: [] };
  for (let round = 0; round < 2; round++) {
    runs.py.push(pythonRuns(server));
    runs.node.push(await nodeRuns(server));
  }
  const best = (list) => ({
    sequentialS: Math.min(...list.map((r) => r.sequentialS)),
    pipelinedS: Math.min(...list.map((r) => r.pipelinedS)),
  });
  const node = best(runs.node);
  const py = best(runs.py);
  console.log(`store ${values.store}; pipelined in batches of ${BATCH}; Node ${process.version}`);
  console.log(`${"client, add".padEnd(30)} ${"calls".padStart(7)} ${"rate".padStart(12)} ${"per add".padStart(11)}`);
  console.log(row("node, one at a time", SEQUENTIAL, node.sequentialS));
  console.log(row("python, one at a time", SEQUENTIAL, py.sequentialS));
  console.log(row("node, pipelined", PIPELINED, node.pipelinedS));
  console.log(row("python, pipelined", PIPELINED, py.pipelinedS));
  console.log(
    `node / python: one at a time ${(py.sequentialS / node.sequentialS).toFixed(2)}x, ` +
      `pipelined ${(py.pipelinedS / node.pipelinedS).toFixed(2)}x (above 1: Node is faster)`,
  );
} finally {
  await server.stop();
}
