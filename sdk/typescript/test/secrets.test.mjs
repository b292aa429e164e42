import assert from "node:assert/strict";
import { test } from "node:test";
import { BadRequest, Conflict, NotFound, Secrets } from "../dist/index.js";
import { client } from "./helpers.mjs";

test("secrets: stored, listed without their value, refused, deleted", async () => {
  const s = await Secrets.create("sdk-ts-token", "s3cr3t-value-ts", { client });
  assert.deepEqual([s.name, s.bytes], ["sdk-ts-token", "s3cr3t-value-ts".length]);
  try {
    const listed = (await Secrets.list({ client })).find((x) => x.name === "sdk-ts-token");
    assert.deepEqual(listed, s);
    assert.ok(!JSON.stringify(listed).includes("s3cr3t"));
    await assert.rejects(Secrets.create("sdk-ts-token", "other", { client }), (e) => e instanceof Conflict);
    await assert.rejects(Secrets.create("sdk-ts-bad", "two\nlines", { client }), (e) => e instanceof BadRequest);
  } finally {
    await Secrets.delete("sdk-ts-token", { client });
  }
  assert.ok(!(await Secrets.list({ client })).some((x) => x.name === "sdk-ts-token"));
  await assert.rejects(Secrets.delete("sdk-ts-token", { client }), (e) => e instanceof NotFound);
});
