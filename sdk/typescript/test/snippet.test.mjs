// The README / issue snippet, run unchanged by a separate node process in a
// fresh project that installed the packed SDK the way a user would
// (`npm install <tarball>`), finding the daemon through HATCHERY_URL /
// HATCHERY_API_KEY. Only `code` is defined before it. /workspace exists in
// the code-interpreter template (and a write creates missing parents).
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { Sandbox } from "../dist/index.js";
import { client, noLeftovers } from "./helpers.mjs";

noLeftovers();
const pkg = join(dirname(fileURLToPath(import.meta.url)), "..");

const SNIPPET = `
import { Sandbox } from "hatchery-sdk";
const sbx = await Sandbox.create({ template: "code-interpreter", ttlSeconds: 120, metadata: { source: "docs" } });
try {
  await sbx.filesystem.write("/workspace/snippet.py", code);
  const r = await sbx.exec("cd /workspace && python3 snippet.py", { timeoutSeconds: 10 });
  console.log(r.exitCode, r.stdout, r.stderr);
} finally { await sbx.kill(); }
`;
const PRELUDE = `const code = "import sys\\nprint(6 * 7)\\nprint('warn', file=sys.stderr)\\n";\n`;

test("the TypeScript snippet runs unchanged from an installed package", async () => {
  const dir = mkdtempSync(join(tmpdir(), "hxsdk-snippet-"));
  try {
    const tgz = execFileSync("npm", ["pack", "--silent", "--pack-destination", dir], { cwd: pkg, encoding: "utf8" }).trim().split("\n").at(-1);
    writeFileSync(join(dir, "package.json"), JSON.stringify({ name: "snippet", private: true, type: "module" }));
    execFileSync("npm", ["install", "--silent", "--no-audit", "--no-fund", "--offline", join(dir, tgz)], { cwd: dir });
    writeFileSync(join(dir, "snippet.mjs"), PRELUDE + SNIPPET);
    const out = execFileSync("node", ["snippet.mjs"], { cwd: dir, encoding: "utf8", env: process.env });
    assert.equal(out, "0 42\n warn\n\n");
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  assert.deepEqual(await Sandbox.list({ client }), []);
});
