// Network policy API (GET/PUT /v1/sandboxes/{id}/network, .../events, and
// `network` on create and fork).
import assert from "node:assert/strict";
import { test } from "node:test";
import { BadRequest, Sandbox } from "../dist/index.js";
import { client, noLeftovers } from "./helpers.mjs";

noLeftovers();
const HOST = "pypi.example"; // resolved by the test daemons' hosts file (tests/sdk/support.py)

test("network: default, update, events", async () => {
  await Sandbox.use({ ttlSeconds: 60, client }, async (s) => {
    assert.deepEqual(await s.network.get(), { egress: "deny", allow: [], deny: [] });
    const want = { egress: "deny", allow: [{ cidr: "203.0.113.0/24", ports: [9, 443] }], deny: [] };
    assert.deepEqual(await s.network.update(want), want);
    assert.deepEqual(await s.network.get(), want);
    assert.deepEqual((await s.network.update({ egress: "deny", deny: [{ host: HOST }] })).deny, [{ host: HOST, ports: [] }]);
    await assert.rejects(s.network.update({ egress: "sometimes" }), BadRequest);
    await assert.rejects(s.network.update({ egress: "deny", allow: [{ cidr: "203.0.113.0/24", host: "both.example" }] }), BadRequest);
    await s.network.update({ egress: "deny" });
    await s.exec("python3 -c \"import socket; s=socket.socket(); s.settimeout(2); s.connect_ex(('198.51.100.7', 443))\"", { timeoutSeconds: 10 });
    // Denied attempts reach the event log asynchronously (the host's packet
    // log is read in the background): wait, bounded.
    const deadline = Date.now() + 30_000;
    for (;;) {
      const evs = await s.network.events();
      if (evs.some((e) => e.destination === "198.51.100.7" && e.port === 443 && e.protocol === "tcp")) break;
      assert.ok(Date.now() < deadline, JSON.stringify(evs));
      await new Promise((r) => setTimeout(r, 200));
    }
    // Exact, where the log is rate-limited: at least every logged one.
    const total = await s.network.deniedTotal();
    const logged = (await s.network.events()).length;
    assert.ok(Number.isInteger(total) && total >= logged && logged >= 1, `${total} of ${logged}`);
  });
});

test("network: on create and fork", async () => {
  const policy = { egress: "deny", allow: [{ host: HOST, ports: [443] }], deny: [] };
  await Sandbox.use({ ttlSeconds: 60, network: policy, client }, async (s) => {
    assert.deepEqual(await s.network.get(), policy);
    const snap = await s.snapshot();
    const f = await snap.fork({ ttlSeconds: 60, network: { egress: "deny", allow: [{ cidr: "203.0.113.0/24" }] } });
    const plain = await snap.fork({ ttlSeconds: 60 });
    try {
      assert.deepEqual(await f.network.get(), { egress: "deny", allow: [{ cidr: "203.0.113.0/24", ports: [] }], deny: [] });
      assert.deepEqual(await plain.network.get(), { egress: "deny", allow: [], deny: [] }); // forks do not inherit
    } finally {
      await f.kill();
      await plain.kill();
      await snap.delete();
    }
  });
});
