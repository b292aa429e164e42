import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import { BadRequest, NotFound, Sandbox } from "../dist/index.js";
import { client, noLeftovers, sleep, tmpSandbox } from "./helpers.mjs";

noLeftovers();

test("create, get, list with metadata, setTtl, kill", async () => {
  const s = await Sandbox.create({ template: "code-interpreter", ttlSeconds: 120, metadata: { owner: "alice", k: "v" }, env: { MODE: "test" }, client });
  assert.match(s.id, /^sbx_[a-z0-9]{16}$/);
  assert.equal(s.info.state, "running");
  assert.equal(s.info.template, "code-interpreter");
  assert.ok(["pool", "restore", "cold"].includes(s.info.bootMode));
  assert.ok(s.info.bootMs >= 0);
  assert.deepEqual(s.info.metadata, { owner: "alice", k: "v" });
  const other = await Sandbox.create({ ttlSeconds: 60, metadata: { owner: "bob" }, client });

  const got = await Sandbox.get(s.id, { client });
  assert.equal(got.info.expiresAt, s.info.expiresAt);
  assert.equal(got.info.bootMode, undefined);
  assert.deepEqual((await Sandbox.list({ client })).map((x) => x.id), [s.id, other.id]);
  assert.deepEqual((await Sandbox.list({ metadata: { owner: "alice" }, client })).map((x) => x.id), [s.id]);
  assert.deepEqual(await Sandbox.list({ metadata: { owner: "alice", k: "no" }, client }), []);
  assert.equal((await s.exec("echo $MODE")).stdout, "test\n");

  const before = s.info.expiresAt;
  await sleep(1100);
  assert.equal(await s.setTtl(1800), s);
  assert.ok(s.info.expiresAt > before);
  assert.equal((await Sandbox.get(s.id, { client })).info.expiresAt, s.info.expiresAt);

  await s.kill();
  await s.kill(); // idempotent
  assert.equal(await s.isRunning(), false);
  await assert.rejects(Sandbox.get(s.id, { client }), (e) => e instanceof NotFound && e.status === 404 && e.code === "sandbox_not_found");
  await other.kill();
});

test("default client comes from HATCHERY_URL / HATCHERY_API_KEY", async () => {
  const s = await Sandbox.create({ ttlSeconds: 60 });
  assert.equal((await Sandbox.get(s.id)).id, s.id);
  assert.equal((await s.refresh()).info.state, "running");
  await s.kill();
});

test("Sandbox.use and asyncDispose kill the sandbox, also when the body throws", async () => {
  let id;
  await assert.rejects(
    Sandbox.use({ ttlSeconds: 60, client }, async (s) => {
      id = s.id;
      await s.filesystem.write("/workspace/x", "1");
      throw new Error("boom");
    }),
    /boom/,
  );
  await assert.rejects(Sandbox.get(id, { client }), NotFound);
  assert.equal(await Sandbox.use({ ttlSeconds: 60, client }, async (s) => (await s.exec("echo ok")).stdout), "ok\n");

  const s = await Sandbox.create({ ttlSeconds: 60, client });
  try {
    throw new Error("inside try");
  } catch {
    // what `await using` does at scope end
  } finally {
    await s[Symbol.asyncDispose]();
  }
  await assert.rejects(Sandbox.get(s.id, { client }), NotFound);
});

test("exec result fields and options", async (t) => {
  const s = await tmpSandbox(t);
  const r = await s.exec("echo out; echo err >&2; exit 3", { timeoutSeconds: 10 });
  assert.deepEqual(
    [r.stdout, r.stderr, r.exitCode, r.timedOut, r.truncated, r.oomKilled],
    ["out\n", "err\n", 3, false, false, false],
  );
  assert.ok(r.durationMs >= 0 && r.cpuMs >= 0);
  assert.deepEqual([r.reason, r.contained], ["exited", true]);
  await s.filesystem.write("/workspace/d/f.txt", "x");
  assert.equal((await s.exec("pwd; ls", { cwd: "/workspace/d" })).stdout, "/workspace/d\nf.txt\n");
  assert.equal((await s.exec("echo $A-$B", { env: { A: "1", B: "2" } })).stdout, "1-2\n");
  assert.equal((await s.exec("tr a-z A-Z", { stdin: "hello" })).stdout, "HELLO");
  assert.equal((await s.exec(undefined, { argv: ["python3", "-c", "import sys; print(sys.argv[1])", "a b; c"] })).stdout, "a b; c\n");
  const big = await s.exec("head -c 5000 /dev/zero | tr '\\0' a", { maxOutputBytes: 100 });
  assert.ok(big.truncated);
  assert.equal(big.stdout.length, 100);
  assert.equal(big.reason, "output_limit");
  const slow = await s.exec("sleep 30", { timeoutSeconds: 1 });
  assert.ok(slow.timedOut);
  assert.equal(slow.exitCode, 137);
  assert.equal(slow.reason, "timeout");
  await assert.rejects(s.exec("true", { argv: ["true"] }), TypeError);
  await assert.rejects(s.exec("true", { cwd: "/nope" }), (e) => e instanceof NotFound && e.code === "not_found");
  await assert.rejects(s.exec("true", { timeoutSeconds: 0 }), (e) => e instanceof BadRequest && e.code === "invalid_request");
});

test("connection reuse: sequential calls share one kept-alive connection", async (t) => {
  const s = await tmpSandbox(t);
  const port = new globalThis.URL(process.env.HATCHERY_URL).port;
  // Client-side sockets to the daemon in any state (a closed one lingers in
  // TIME_WAIT), from the kernel's table.
  const sockets = () => readFileSync("/proc/net/tcp", "utf8").split("\n").slice(1)
    .filter((l) => l.trim() && parseInt(l.trim().split(/\s+/)[2].split(":")[1], 16) === Number(port)).length;
  await s.refresh();
  const before = sockets();
  for (let i = 0; i < 10; i++) await s.refresh();
  await s.exec("true");
  assert.ok(sockets() - before <= 1, `${before} -> ${sockets()} sockets for 11 calls`);
});

test("health, metrics, openapi", async () => {
  const h = await client.health();
  assert.equal(h.status, "ok");
  assert.equal(h.runtime, "gvisor");
  assert.match(await client.metrics(), /hatchery_/);
  assert.ok("/v1/sandboxes" in (await client.openapi()).paths);
});
