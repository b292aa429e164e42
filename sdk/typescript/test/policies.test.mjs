import assert from "node:assert/strict";
import { test } from "node:test";
import { BadRequest, Conflict, NotFound, Policies } from "../dist/index.js";
import { client } from "./helpers.mjs";

const rules = [{ id: "push-own", effect: "allow", match: { tools: ["git_push"], args: [{ field: "branch", op: "eq", value: { ctx: "session_branch" } }] } }];

test("policies: create, version, read back, errors", async () => {
  const p = await Policies.create({ name: "sdk-ts", rules }, { client });
  assert.equal(p.version, 1);
  assert.deepEqual(p.document.rules, rules);
  const p2 = await Policies.addVersion(p.id, { name: "sdk-ts", rules: [...rules, { id: "rest", effect: "deny" }] }, { client });
  assert.equal(p2.version, 2);
  assert.equal((await Policies.get(p.id, { client })).version, 2);
  assert.deepEqual((await Policies.getVersion(p.id, 1, { client })).document, p.document);
  const list = await Policies.list({ client });
  assert.equal(list.find((s) => s.id === p.id).latestVersion, 2);
  assert.ok(list.find((s) => s.id === "pol_standard").builtin);
  await assert.rejects(
    Policies.addVersion(p.id, { name: "x", rules: [{ id: "ok", effect: "allow" }, { id: "Bad", effect: "deny" }] }, { client }),
    (e) => e instanceof BadRequest && e.code === "invalid_policy" && e.message.includes('rule 1 (id "Bad")'),
  );
  await assert.rejects(Policies.addVersion("pol_standard", { name: "x", rules: [] }, { client }), (e) => e instanceof Conflict);
  await assert.rejects(Policies.getVersion(p.id, 3, { client }), (e) => e instanceof NotFound);
});
