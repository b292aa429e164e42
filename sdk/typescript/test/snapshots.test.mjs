import assert from "node:assert/strict";
import { test } from "node:test";
import { NotFound, Snapshot } from "../dist/index.js";
import { client, noLeftovers, tmpSandbox } from "./helpers.mjs";

noLeftovers();

test("snapshot, get, list, fork, forkMany, delete", async (t) => {
  const s = await tmpSandbox(t);
  await s.filesystem.write("/workspace/state.txt", "before");
  const snap = await s.snapshot({ retentionSeconds: 3600, metadata: { candidate: "c-42" } });
  assert.match(snap.id, /^snap_/);
  assert.equal(snap.info.sandboxId, s.id);
  assert.ok(snap.info.sizeBytes > 0);
  assert.deepEqual(snap.info.metadata, { candidate: "c-42" });
  const other = await s.snapshot();
  assert.equal((await Snapshot.get(snap.id, { client })).info.createdAt, snap.info.createdAt);
  // Only this test's: the suite's daemon also holds other suites' snapshots
  // (an interview round keeps its prepared one).
  const mine = new Set([snap.id, other.id]);
  assert.deepEqual((await Snapshot.list({ client })).map((x) => x.id).filter((id) => mine.has(id)), [snap.id, other.id]);
  assert.deepEqual((await Snapshot.list({ metadata: { candidate: "c-42" }, client })).map((x) => x.id), [snap.id]);

  await s.filesystem.write("/workspace/state.txt", "after");
  const fork = await snap.fork({ ttlSeconds: 120, metadata: { role: "reviewer" } });
  assert.equal(fork.info.bootMode, "fork");
  assert.deepEqual(fork.info.metadata, { role: "reviewer" });
  assert.equal(await fork.filesystem.readText("/workspace/state.txt"), "before");
  assert.equal(await s.filesystem.readText("/workspace/state.txt"), "after");
  const many = await snap.forkMany(2, { ttlSeconds: 60 });
  assert.equal(new Set(many.map((f) => f.id)).size, 2);
  for (const f of many) assert.equal((await f.exec("cat /workspace/state.txt")).stdout, "before");
  for (const f of [fork, ...many]) await f.kill();

  await snap.delete();
  await snap.delete(); // idempotent
  await other.delete();
  await assert.rejects(Snapshot.get(snap.id, { client }), (e) => e instanceof NotFound && e.code === "snapshot_not_found");
  await assert.rejects(snap.fork(), NotFound);
  assert.deepEqual((await Snapshot.list({ client })).filter((x) => mine.has(x.id)), []);
});

test("a snapshot's warm pool serves forks", async (t) => {
  const s = await tmpSandbox(t);
  await s.filesystem.write("/workspace/state.txt", "pooled");
  const snap = await s.snapshot({ retentionSeconds: 600 });
  try {
    assert.deepEqual(await snap.pool(), { snapshotId: snap.id, size: 0, ready: 0, sandboxIds: [] });
    const p = await snap.setPool(1);
    assert.equal(p.snapshotId, snap.id);
    assert.equal(p.size, 1);
    const deadline = Date.now() + 120_000;
    while ((await snap.pool()).ready < 1) {
      assert.ok(Date.now() < deadline, "the pool never filled");
      await new Promise((r) => setTimeout(r, 300));
    }
    const pooled = (await snap.pool()).sandboxIds;
    const fork = await snap.fork({ ttlSeconds: 60 });
    assert.ok(pooled.includes(fork.id), `${fork.id} not from ${pooled}`);
    assert.equal(fork.info.bootMode, "pool");
    assert.equal(await fork.filesystem.readText("/workspace/state.txt"), "pooled");
    await fork.kill();
    assert.equal((await snap.setPool(0)).size, 0);
  } finally {
    await snap.delete();
  }
});
