import assert from "node:assert/strict";
import { test } from "node:test";
import { Conflict, NotFound, TooLarge } from "../dist/index.js";
import { MAX_FILE_BYTES, noLeftovers, tmpSandbox } from "./helpers.mjs";

noLeftovers();

test("write, read, readText, list, remove, exists", async (t) => {
  const s = await tmpSandbox(t);
  const fs = s.filesystem;
  await fs.write("/workspace/a.txt", "héllo\n");
  const blob = new Uint8Array(1024).map((_, i) => i % 256);
  await fs.write("/workspace/sub/dir/b.bin", blob); // parents are created
  assert.deepEqual(await fs.read("/workspace/a.txt"), new TextEncoder().encode("héllo\n"));
  assert.ok((await fs.read("/workspace/a.txt")) instanceof Uint8Array);
  assert.equal(await fs.readText("/workspace/a.txt"), "héllo\n");
  assert.deepEqual(await fs.read("/workspace/sub/dir/b.bin"), blob);

  const entries = Object.fromEntries((await fs.list("/workspace")).map((e) => [e.name, e]));
  assert.deepEqual(entries["a.txt"].type, "file");
  assert.equal(entries["a.txt"].size, 7);
  assert.equal(entries["a.txt"].mode, 0o644);
  assert.ok(entries["a.txt"].mtime > 0);
  assert.equal(entries.sub.type, "dir");

  assert.ok(await fs.exists("/workspace/a.txt"));
  assert.ok(await fs.exists("/workspace/sub"));
  assert.ok(await fs.exists("/"));
  assert.equal(await fs.exists("/workspace/missing"), false);
  assert.equal(await fs.exists("/nope/deeper"), false);
  assert.equal(await fs.exists("/workspace/a.txt/under-a-file"), false);

  await fs.remove("/workspace/sub");
  assert.equal(await fs.exists("/workspace/sub"), false);
  await assert.rejects(fs.remove("/workspace/sub"), (e) => e instanceof NotFound && e.code === "file_not_found");
  assert.equal((await s.exec("cat /workspace/a.txt")).stdout, "héllo\n");
});

test("file errors: 404, 409, 413", async (t) => {
  const s = await tmpSandbox(t);
  const fs = s.filesystem;
  await assert.rejects(fs.read("/workspace/missing"), (e) => e instanceof NotFound && e.status === 404 && e.code === "file_not_found");
  await assert.rejects(fs.read("/workspace"), (e) => e instanceof Conflict && e.code === "file_conflict");
  await assert.rejects(fs.write("/workspace/big", new Uint8Array(MAX_FILE_BYTES + 1)), (e) => e instanceof TooLarge && e.status === 413 && e.code === "too_large");
  await fs.write("/workspace/ok", new Uint8Array(MAX_FILE_BYTES));
  assert.equal((await fs.read("/workspace/ok")).length, MAX_FILE_BYTES);
  assert.equal(await fs.exists("/workspace/big"), false);
});
