import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdirSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { BadRequest, BuildFailed, Conflict, NotFound, Sandbox, Template } from "../dist/index.js";
import { TEMPLATES_DIR, client, noLeftovers } from "./helpers.mjs";

noLeftovers();
const NAME = "sdk-ts-build";

test("list and get", async () => {
  const ts = await Template.list({ client });
  assert.deepEqual(ts.map((t) => t.name), ["code-interpreter"]);
  const t = await Template.get("code-interpreter", { client });
  assert.equal(t.base, "debian-bookworm");
  assert.equal(t.memoryMb, 512);
  assert.equal(typeof t.checkpointReady, "boolean");
  await assert.rejects(Template.get("no-such-template", { client }), (e) => e instanceof NotFound && e.code === "template_not_found");
  await assert.rejects(Template.get("Bad_Name", { client }), (e) => e instanceof BadRequest && e.code === "invalid_template_name");
});

test("build with progress, use, failed build, events, delete", async () => {
  // Seed the default rootfs (same base and packages) so the build skips
  // debootstrap: see tests/sdk/support.py seed_rootfs.
  const src = join(TEMPLATES_DIR, "code-interpreter", readdirSync(join(TEMPLATES_DIR, "code-interpreter")).find((n) => n.startsWith("rootfs-")));
  mkdirSync(join(TEMPLATES_DIR, NAME), { recursive: true });
  execFileSync("cp", ["-a", src, join(TEMPLATES_DIR, NAME)]);

  const progress = [];
  const logs = [];
  const t = await Template.build(
    { name: NAME, files: { "/opt/hello.txt": "from the sdk\n" }, setup: ["python3 -c \"open('/opt/setup-ran','w').write('yes')\""], memoryMb: 256 },
    { client, onProgress: (p, s) => progress.push([p, s]), onLog: (l) => logs.push(l) },
  );
  assert.equal(t.name, NAME);
  assert.deepEqual(t.files, ["/opt/hello.txt"]);
  assert.equal(t.memoryMb, 256);
  const steps = progress.map(([, s]) => s);
  assert.equal(steps[0], "rootfs");
  assert.ok(steps.includes("setup") && steps.includes("activate"));
  assert.equal(steps.at(-1), "done");
  const pcts = progress.map(([p]) => p);
  assert.deepEqual(pcts, [...pcts].sort((a, b) => a - b));
  assert.ok(logs.some((l) => l.includes("file /opt/hello.txt")));

  await Sandbox.use({ template: NAME, ttlSeconds: 60, client }, async (s) => {
    assert.equal((await s.exec("cat /opt/hello.txt /opt/setup-ran")).stdout, "from the sdk\nyes");
    await assert.rejects(Template.delete(NAME, { client }), Conflict);
  });

  await assert.rejects(Template.build({ name: NAME, setup: ["exit 3"] }, { client }), (e) => e instanceof BuildFailed && e.code === "build_failed");
  assert.equal((await Template.get(NAME, { client })).version, t.version);

  const acc = await Template.startBuild({ name: NAME, setup: ["true"] }, { client });
  const evs = [];
  for await (const ev of Template.buildEvents(NAME, acc.buildId, { client })) evs.push(ev);
  assert.equal(evs.at(-1).kind, "done");
  assert.equal(evs.at(-1).data.version, acc.version);
  await assert.rejects(async () => { for await (const _ of Template.buildEvents(NAME, "bld_nope", { client })) { /* none */ } },
    (e) => e instanceof NotFound && e.code === "build_not_found");

  await Template.delete(NAME, { client });
  await assert.rejects(Template.get(NAME, { client }), NotFound);
});
