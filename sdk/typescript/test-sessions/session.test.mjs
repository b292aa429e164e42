// Session against a live daemon with the scripted model and a real git
// server (run through tests/sessions/with_session_daemon.py).
import assert from "node:assert/strict";
import { test } from "node:test";
import { BadRequest, Client, Conflict, Policies, Session } from "../dist/index.js";

const client = new Client({ url: process.env.HATCHERY_URL, apiKey: process.env.HATCHERY_API_KEY });
const repo = process.env.HATCHERY_TEST_REPO;
if (!repo) throw new Error("run through tests/sessions/with_session_daemon.py");

test("a session runs to completion; events come once each, in order, across reconnects", async () => {
  const s = await Session.create({ repo, task: "[script:fix] make it pass", idempotencyKey: "ts-1", client, metadata: { tenant: "acme" } });
  assert.deepEqual(s.info.metadata, { tenant: "acme" });
  const again = await Session.create({ repo, task: "[script:fix] make it pass", idempotencyKey: "ts-1", client, metadata: { tenant: "acme" } });
  assert.equal(again.id, s.id);
  await assert.rejects(Session.create({ repo, task: "other", idempotencyKey: "ts-1", client }), Conflict);
  // Read a few events, stop, go on from the last seq: nothing lost or doubled.
  const seen = [];
  for await (const ev of s.events()) {
    seen.push(ev);
    if (seen.length === 5) break;
  }
  for await (const ev of s.events({ after: seen.at(-1).seq })) seen.push(ev);
  assert.equal(seen.at(-1).type, "state_changed");
  assert.equal(seen.at(-1).to, "completed");
  assert.deepEqual(seen.map((e) => e.seq), seen.map((_, i) => i + 1));
  const all = [];
  for await (const ev of s.events({ follow: false })) all.push(ev);
  assert.deepEqual(all, seen);
  assert.equal((await s.refresh()).state, "completed");
  assert.ok((await Session.list({ client })).some((x) => x.id === s.id));
});

test("steer a waiting agent, then cancel another mid-run", async () => {
  const std = await client.json("GET /v1/policies/{id}", { id: "pol_standard" });
  const doc = { name: "ts-move", rules: std.document.rules };
  const pol = await Policies.create(doc, { client });
  const s = await Session.create({ repo, task: "[script:ask] ask me", policyId: pol.id, client });
  for await (const ev of s.events()) if (ev.type === "waiting") break;
  // A policy move while it waits: to the latest version, back to 1.
  await Policies.addVersion(pol.id, doc, { client });
  assert.equal((await s.movePolicy()).info.policy_version, 2);
  assert.equal((await s.movePolicy(1)).info.policy_version, 1);
  await assert.rejects(s.movePolicy(3), BadRequest);
  const moved = [];
  for await (const ev of s.events({ follow: false })) if (ev.type === "policy_moved") moved.push([ev.from_version, ev.to_version]);
  assert.deepEqual(moved, [[1, 2], [2, 1]]);
  assert.ok((await s.message("ts.txt")) > 0);
  await s.wait("completed", 240_000);
  assert.equal(s.info.reason, "agent finished: wrote ts.txt");
  await assert.rejects(s.message("late"), Conflict);
  const s2 = await Session.create({ repo, task: "[script:steer] long", client });
  for await (const ev of s2.events()) if (ev.type === "tool_call") break;
  assert.equal((await s2.cancel()).state, "cancelled");
  assert.equal((await s2.cancel()).state, "cancelled");
  assert.ok(s2.info.review_snapshot_id);
});
