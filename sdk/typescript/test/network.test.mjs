// Network policy API (GET/PUT /v1/sandboxes/{id}/network, .../events), being
// added to the daemon in parallel: skipped, saying so, while the live
// daemon's OpenAPI document does not list the route.
import assert from "node:assert/strict";
import { test } from "node:test";
import { BadRequest, Sandbox } from "../dist/index.js";
import { client, noLeftovers } from "./helpers.mjs";

noLeftovers();
const has = "/v1/sandboxes/{id}/network" in (await client.openapi()).paths;
const skip = has ? false : "daemon has no network policy API yet";

test("network: default, update, events", { skip }, async () => {
  await Sandbox.use({ ttlSeconds: 60, client }, async (s) => {
    assert.equal((await s.network.get()).egress, "deny");
    const want = { egress: "deny", allow: [{ cidr: "127.0.0.1/32", ports: [9] }], deny: [] };
    assert.deepEqual(await s.network.update(want), want);
    assert.deepEqual(await s.network.get(), want);
    assert.equal((await s.network.update({ egress: "allow", deny: [{ host: "pypi.example" }] })).egress, "allow");
    await assert.rejects(s.network.update({ egress: "sometimes" }), BadRequest);
    await s.network.update({ egress: "deny" });
    await s.exec("python3 -c \"import socket; s=socket.socket(); s.settimeout(2); s.connect_ex(('198.51.100.7', 443))\"");
    const evs = await s.network.events();
    assert.ok(evs.some((e) => e.destination === "198.51.100.7" && e.port === 443 && e.protocol === "tcp"), JSON.stringify(evs));
  });
});

test("network: on create and fork", { skip }, async () => {
  const policy = { egress: "deny", allow: [{ host: "pypi.example", ports: [443] }], deny: [] };
  await Sandbox.use({ ttlSeconds: 60, network: policy, client }, async (s) => {
    assert.deepEqual(await s.network.get(), policy);
    const snap = await s.snapshot();
    const f = await snap.fork({ ttlSeconds: 60, network: { egress: "deny" } });
    try {
      assert.equal((await f.network.get()).egress, "deny");
      assert.deepEqual((await f.network.get()).allow ?? [], []);
    } finally {
      await f.kill();
      await snap.delete();
    }
  });
});
