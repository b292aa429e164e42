import assert from "node:assert/strict";
import { test } from "node:test";
import { AuthError, Client, Conflict, PermissionDenied, RateLimited, Sandbox, Tenants } from "../dist/index.js";
import { URL, client } from "./helpers.mjs";

test("tenants: limits, a key shown once, its own view, revoke", async () => {
  const t = await Tenants.create("sdk-ts", { limits: { liveSandboxes: 1 }, client });
  assert.match(t.id, /^ten_/);
  assert.equal(t.limits.liveSandboxes, 1);
  assert.equal(t.limits.tokens, null);
  assert.deepEqual(await Tenants.get(t.id, { client }), t);
  assert.ok((await Tenants.list({ client })).some((x) => x.id === t.id));
  const k = await Tenants.createKey(t.id, { client });
  assert.ok(k.key.startsWith(k.prefix));
  const listed = await Tenants.listKeys(t.id, { client });
  assert.deepEqual(listed.map((x) => x.id), [k.id]);
  assert.equal(listed[0].key, undefined);

  const mine = new Client({ url: URL, apiKey: k.key });
  const sbx = await Sandbox.create({ ttlSeconds: 120, client: mine });
  try {
    assert.equal(sbx.info.metadata.tenant, t.id);
    assert.deepEqual((await Sandbox.list({ client: mine })).map((s) => s.id), [sbx.id]);
    await assert.rejects(Sandbox.create({ ttlSeconds: 120, client: mine }), (e) => e instanceof RateLimited && e.code === "tenant_limit");
    await assert.rejects(Tenants.list({ client: mine }), (e) => e instanceof PermissionDenied);
    await assert.rejects(Tenants.delete(t.id, { client }), (e) => e instanceof Conflict);
  } finally {
    await sbx.kill();
  }
  const u = await Tenants.update(t.id, { name: "sdk-ts-2" }, { client });
  assert.equal(u.name, "sdk-ts-2");
  assert.deepEqual(u.limits, t.limits);
  assert.ok((await Tenants.revokeKey(t.id, k.id, { client })).revokedAt);
  await assert.rejects(Sandbox.list({ client: mine }), (e) => e instanceof AuthError);
  await Tenants.delete(t.id, { client });
});
