// 410 `sandbox_lost` (a sandbox stopped with its lost host) as its own
// class, with which host, when and why; still a NotFound. The live 410
// comes only from several hosts on a shared store (tests/store/test_hosts_api.py
// checks it with the Python SDK); here the mapping from the wire shape.
import assert from "node:assert/strict";
import { test } from "node:test";
import { NotFound, SandboxLost, errorFor, errorFromEvent } from "../dist/index.js";

test("a 410 sandbox_lost is a SandboxLost (a NotFound) carrying host, when and why", () => {
  const e = errorFor(410, "sandbox_lost", "sandbox sbx_a was lost with its host h1", undefined,
    { host: "h1", lost_at_ms: 1765000000123, reason: "its host stopped heartbeating" });
  assert.ok(e instanceof SandboxLost && e instanceof NotFound);
  assert.equal(e.status, 410);
  assert.deepEqual([e.host, e.lostAtMs, e.reason], ["h1", 1765000000123, "its host stopped heartbeating"]);
  const s = errorFromEvent({ error: { code: "sandbox_lost", message: "m", host: "h2" } });
  assert.ok(s instanceof SandboxLost && s.host === "h2" && s.status === 410);
  // Another 410 is not a lost sandbox.
  assert.ok(!(errorFor(410, "gone", "m") instanceof SandboxLost));
  assert.ok(errorFor(404, "sandbox_not_found", "m") instanceof NotFound);
});
