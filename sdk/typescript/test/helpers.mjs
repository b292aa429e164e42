// Shared by the suites: the daemon comes from tests/sdk/with_daemon.py
// (HATCHERY_URL, HATCHERY_API_KEY, HATCHERY_TEST_*), which also checks
// afterwards that nothing was left behind.
import assert from "node:assert/strict";
import { afterEach } from "node:test";
import { Client, Sandbox } from "../dist/index.js";

export const URL = process.env.HATCHERY_URL;
export const KEY = process.env.HATCHERY_API_KEY;
export const PROXY = process.env.HATCHERY_TEST_PROXY_URL;
export const CAPPED = process.env.HATCHERY_TEST_CAPPED_URL;
export const TEMPLATES_DIR = process.env.HATCHERY_TEST_TEMPLATES_DIR;
export const MAX_FILE_BYTES = Number(process.env.HATCHERY_TEST_MAX_FILE_BYTES);
if (!URL || !KEY || !PROXY) throw new Error("run through tests/sdk/with_daemon.py (make sdk-typescript-test)");

export const client = new Client({ url: URL, apiKey: KEY });

const owned = [];

/** After every test of the file (and its tmpSandbox kills), no sandbox may be listed. */
export function noLeftovers() {
  afterEach(async () => {
    while (owned.length) await owned.pop().kill();
    const left = await Sandbox.list({ client });
    for (const s of left) await s.kill();
    assert.deepEqual(left.map((s) => s.id), [], "test left sandboxes behind");
  });
}

/** Creates a sandbox for one test and kills it afterwards. */
export async function tmpSandbox(_t, opts = {}) {
  const s = await Sandbox.create({ ttlSeconds: 300, metadata: { suite: "typescript" }, client, ...opts });
  owned.push(s);
  return s;
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
