// The README's five-minute example is examples/quickstart.mjs, word for word, and it runs
// against a real server; `npm pack` builds a package with the compiled code and types.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import * as path from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import { Server, removeDir, tempDir } from "./servers.mjs";

const PACKAGE = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");

test("the README's example is examples/quickstart.mjs, and it runs", async () => {
  const readme = readFileSync(path.join(PACKAGE, "README.md"), "utf8");
  const example = readFileSync(path.join(PACKAGE, "examples/quickstart.mjs"), "utf8");
  const block = /<!-- quickstart: examples\/quickstart.mjs -->\n```js\n([\s\S]*?)```/.exec(readme);
  assert.ok(block, "README.md has the quickstart block");
  assert.equal(block[1], example);
  const server = await Server.start();
  try {
    const run = spawnSync(process.execPath, [path.join(PACKAGE, "examples/quickstart.mjs")], {
      env: { ...process.env, DELAYWHEEL_URL: `delaywheel://${server.address}` },
      encoding: "utf8",
      timeout: 60_000,
    });
    assert.equal(run.status, 0, run.stderr);
    assert.match(run.stdout, /^added \S+\nreserved \S+ a@example.com\nsending to b@example.com\n$/);
  } finally {
    await server.stop();
  }
});

test("npm pack builds the package: compiled code and its types", () => {
  const dir = tempDir();
  try {
    const pack = spawnSync("npm", ["pack", "--json", "--pack-destination", dir], {
      cwd: PACKAGE,
      encoding: "utf8",
      timeout: 120_000,
    });
    assert.equal(pack.status, 0, pack.stderr);
    const [info] = JSON.parse(pack.stdout.slice(pack.stdout.indexOf("[")));
    assert.equal(info.name, "delaywheel-client");
    const files = info.files.map((f) => f.path);
    for (const file of ["dist/index.js", "dist/index.d.ts", "dist/cluster.d.ts", "README.md", "package.json"]) {
      assert.ok(files.includes(file), `${file} in ${files.join(", ")}`);
    }
    assert.ok(!files.some((f) => f.startsWith("test/") || f.startsWith("src/")), files.join(", "));
  } finally {
    removeDir(dir);
  }
});
