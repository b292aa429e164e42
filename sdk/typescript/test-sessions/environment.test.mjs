// Environment against a live daemon with the scripted model and a real git
// server (run through tests/sessions/with_session_daemon.py).
import assert from "node:assert/strict";
import { test } from "node:test";
import { Client, Environment, HatcheryError, NotFound, Session } from "../dist/index.js";

const client = new Client({ url: process.env.HATCHERY_URL, apiKey: process.env.HATCHERY_API_KEY });
const repo = process.env.HATCHERY_TEST_REPO;
if (!repo) throw new Error("run through tests/sessions/with_session_daemon.py");

test("an environment builds once, a session starts from it, a failed set-up says why", async () => {
  const e = await Environment.create({ name: "ts", repo, setup: "echo ready > .ready", client });
  assert.equal(e.version, null);
  const kinds = [];
  assert.equal(await e.build((kind) => kinds.push(kind)), 1);
  assert.ok(kinds.includes("step"));
  assert.equal(e.version, 1);
  assert.deepEqual((await Environment.list(client)).map((x) => x.id), [e.id]);
  const s = await Session.create({ environmentId: e.id, task: "[script:quick] start", client });
  for await (const _ of s.events()) {
    // to the end
  }
  await s.refresh();
  assert.equal(s.info.environment_id, e.id);
  assert.equal(s.info.environment_version, 1);
  await e.delete();
  await assert.rejects(Environment.get(e.id, client), NotFound);
  assert.equal(e.info.pool_size, 2); // the default
  const bad = await Environment.create({ name: "bad", repo, setup: "exit 3", poolSize: 0, client });
  assert.equal(bad.info.pool_size, 0);
  await assert.rejects(bad.build(), (err) => err instanceof HatcheryError && err.code === "setup_failed");
  await bad.delete();
});
