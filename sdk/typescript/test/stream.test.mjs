import assert from "node:assert/strict";
import { test } from "node:test";
import { Client, Sandbox, SandboxTimeout, StreamError } from "../dist/index.js";
import { KEY, PROXY, noLeftovers, sleep, tmpSandbox } from "./helpers.mjs";

noLeftovers();

test("chunks arrive in order, as produced, and the result collects them", async (t) => {
  const s = await tmpSandbox(t);
  const stream = await s.execStream("for i in 1 2 3; do echo $i; sleep 0.3; done; echo oops >&2; exit 3");
  const seen = [];
  const times = [];
  for await (const c of stream) {
    seen.push([c.stream, c.data]);
    times.push(Date.now());
  }
  assert.deepEqual(seen, [["stdout", "1\n"], ["stdout", "2\n"], ["stdout", "3\n"], ["stderr", "oops\n"]]);
  assert.ok(times[2] - times[0] > 400);
  assert.equal(stream.result.exitCode, 3);
  assert.equal(stream.result.stdout, "1\n2\n3\n");
  assert.equal(stream.result.stderr, "oops\n");
});

test("callbacks, wait(), options", async (t) => {
  const s = await tmpSandbox(t);
  const out = [];
  const err = [];
  const r = await (await s.execStream("echo a; echo b >&2; echo c", { onStdout: (d) => out.push(d), onStderr: (d) => err.push(d), cwd: "/workspace" })).wait();
  assert.equal(out.join(""), "a\nc\n");
  assert.deepEqual(err, ["b\n"]);
  assert.equal(r.exitCode, 0);
  const r2 = await (await s.execStream("cat; echo $X; pwd", { stdin: "in\n", env: { X: "y" }, cwd: "/tmp", timeoutSeconds: 5 })).wait();
  assert.equal(r2.stdout, "in\ny\n/tmp\n");
  const r3 = await (await s.execStream("sleep 10", { timeoutSeconds: 1 })).wait();
  assert.ok(r3.timedOut);
  assert.equal(r3.exitCode, 137);
});

test("breaking out of the loop (close) kills the command", async (t) => {
  const s = await tmpSandbox(t);
  const stream = await s.execStream("echo started; sleep 3; touch /tmp/after");
  for await (const c of stream) {
    assert.equal(c.data, "started\n");
    break;
  }
  await sleep(4000);
  assert.equal(await s.filesystem.exists("/tmp/after"), false);
});

test("an error event (sandbox killed mid-stream) throws the typed error", async (t) => {
  const s = await tmpSandbox(t);
  const stream = await s.execStream("echo go; sleep 30");
  const first = await stream.next();
  assert.equal(first.value.data, "go\n");
  setTimeout(() => s.kill(), 500);
  await assert.rejects(stream.wait(), (e) => e instanceof SandboxTimeout && e.code === "guest_unresponsive");
});

test("a stream that ends without an exit event throws StreamError", async (t) => {
  const s = await tmpSandbox(t);
  // The test proxy drops the connection after 40 bytes of the answer.
  const cut = new Sandbox(s.info, new Client({ url: `${PROXY}/cut/40`, apiKey: KEY }));
  const stream = await cut.execStream("echo one; sleep 0.3; echo two; sleep 0.3; echo three");
  await assert.rejects(stream.wait(), StreamError);
  assert.equal(stream.result, undefined);
});
