import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import {
  AuthError, BadRequest, Client, ConnectionFailed, HatcheryError, NotFound, RateLimited, Sandbox, ServerError,
  ServiceUnavailable,
} from "../dist/index.js";
import { CAPPED, KEY, PROXY, URL, client, noLeftovers } from "./helpers.mjs";

noLeftovers();

test("401: wrong key", async () => {
  await assert.rejects(Sandbox.list({ client: new Client({ url: URL, apiKey: "wrong" }) }),
    (e) => e instanceof AuthError && e instanceof HatcheryError && e.status === 401 && e.code === "unauthorized");
});

test("key file for a local daemon; url from the environment", async () => {
  const dir = mkdtempSync(join(tmpdir(), "hxsdk-"));
  const keyFile = join(dir, "api_key");
  writeFileSync(keyFile, `${KEY}\n`);
  const saved = process.env.HATCHERY_API_KEY;
  delete process.env.HATCHERY_API_KEY;
  try {
    assert.deepEqual(await Sandbox.list({ client: new Client({ url: URL, keyFile }) }), []);
    process.env.HATCHERY_KEY_FILE = keyFile;
    assert.deepEqual(await Sandbox.list({ client: new Client() }), []);
    writeFileSync(keyFile, "stale\n");
    await assert.rejects(Sandbox.list({ client: new Client() }), AuthError);
    process.env.HATCHERY_KEY_FILE = join(dir, "missing");
    assert.equal(new Client().transport.apiKey, undefined);
  } finally {
    process.env.HATCHERY_API_KEY = saved;
    delete process.env.HATCHERY_KEY_FILE;
    rmSync(dir, { recursive: true, force: true });
  }
  assert.equal(new Client().url, URL);
  const savedUrl = process.env.HATCHERY_URL;
  delete process.env.HATCHERY_URL;
  try {
    assert.equal(new Client().url, "http://127.0.0.1:7423");
  } finally {
    process.env.HATCHERY_URL = savedUrl;
  }
});

test("404 and 400", async () => {
  await assert.rejects(Sandbox.get("sbx_doesnotexist0000", { client }),
    (e) => e instanceof NotFound && e.code === "sandbox_not_found" && e.message.includes("sbx_doesnotexist0000"));
  await assert.rejects(Sandbox.create({ ttlSeconds: 0, client }), (e) => e instanceof BadRequest && e.status === 400 && e.code === "invalid_request");
  await assert.rejects(Sandbox.create({ template: "no-such-template", client }), (e) => e instanceof NotFound && e.code === "template_not_found");
});

test("503 capacity: retried after Retry-After, then thrown", async () => {
  const capped = new Client({ url: CAPPED, apiKey: KEY });
  const first = await Sandbox.create({ ttlSeconds: 60, client: capped });
  try {
    let t = Date.now();
    await assert.rejects(Sandbox.create({ ttlSeconds: 60, client: new Client({ url: CAPPED, apiKey: KEY, maxRetries: 2 }) }),
      (e) => e instanceof ServiceUnavailable && e instanceof ServerError && e.status === 503 && e.code === "capacity" && e.retryAfter === 1);
    assert.ok(Date.now() - t >= 2000, "two waits of Retry-After");
    t = Date.now();
    await assert.rejects(Sandbox.create({ ttlSeconds: 60, client: new Client({ url: CAPPED, apiKey: KEY, maxRetries: 0 }) }), ServiceUnavailable);
    assert.ok(Date.now() - t < 1000);
  } finally {
    await first.kill();
  }
  const again = await Sandbox.create({ ttlSeconds: 60, client: capped });
  await again.kill();
  assert.deepEqual(await Sandbox.list({ client: capped }), []);
});

test("429 from a rate-limiting gateway: RateLimited with retryAfter, and retried", async () => {
  // The test proxy in front of the daemon plays a rate-limiting gateway: it
  // answers the first n requests of a token with 429 and Retry-After: 1.
  await assert.rejects(Sandbox.list({ client: new Client({ url: `${PROXY}/ratelimit/ts-a/5`, apiKey: KEY, maxRetries: 0 }) }),
    (e) => e instanceof RateLimited && e.status === 429 && e.retryAfter === 1 && e.code === "rate_limited");
  const t = Date.now();
  const viaProxy = new Client({ url: `${PROXY}/ratelimit/ts-b/2`, apiKey: KEY, maxRetries: 2 });
  const out = await Sandbox.use({ ttlSeconds: 60, client: viaProxy }, async (s) => (await s.exec("echo via-proxy")).stdout);
  assert.equal(out, "via-proxy\n");
  assert.ok(Date.now() - t >= 2000);
});

test("connection refused", async () => {
  await assert.rejects(Sandbox.list({ client: new Client({ url: "http://127.0.0.1:9", apiKey: "k", maxRetries: 0 }) }), ConnectionFailed);
});
