// Background processes (exec with background: true) and raw output
// (output: "base64"), against the live daemon.
import assert from "node:assert/strict";
import { test } from "node:test";
import { BadRequest, Client, Conflict, NotFound, Process, ProcessOutput, RateLimited, Sandbox } from "../dist/index.js";
import { KEY, URL, client, noLeftovers, sleep, tmpSandbox } from "./helpers.mjs";

noLeftovers();

async function collect(iterable) {
  const chunks = [];
  for await (const c of iterable) chunks.push(c);
  return chunks;
}
const text = (chunks, stream = "stdout") => chunks.filter((c) => c.stream === stream).map((c) => c.data).join("");

test("background start, list, follow the output to the exit", async (t) => {
  const s = await tmpSandbox(t);
  const t0 = Date.now();
  const proc = await s.exec("for i in 1 2 3; do echo line$i; sleep 0.2; done; echo err >&2; exit 7", { background: true });
  assert.ok(Date.now() - t0 < 1000, "a background start answers at once");
  assert.ok(proc instanceof Process);
  assert.match(proc.id, /^proc_[0-9a-f]{16}$/);
  assert.equal(typeof proc.pid, "number");
  assert.equal(proc.state, "running");
  assert.ok(proc.running && proc.stdinOpen);
  assert.equal(proc.argv[0], "/bin/sh");
  assert.deepEqual((await s.processes()).map((p) => p.id), [proc.id]);

  const out = proc.output();
  assert.ok(out instanceof ProcessOutput);
  const chunks = await collect(out);
  assert.equal(text(chunks), "line1\nline2\nline3\n");
  assert.equal(text(chunks, "stderr"), "err\n");
  assert.equal(chunks[0].offset, 0);
  assert.ok(out.exited);
  assert.deepEqual([out.info.state, out.info.exitCode, out.info.reason], ["exited", 7, "exited"]);
  assert.equal(out.nextOffset, 22);
  assert.equal(out.info.outputBytes, 22);
  assert.equal(proc.exitCode, 7, "the final event updates the Process");
  // for await over the Process replays its output from the start.
  assert.equal(text(await collect(proc)), "line1\nline2\nline3\n");
  const listed = await s.processes();
  assert.deepEqual(listed.map((p) => [p.id, p.state, p.exitCode]), [[proc.id, "exited", 7]]);
  assert.equal((await proc.refresh()).running, false);
});

test("reconnect by id from an offset; follow: false", async (t) => {
  const s = await tmpSandbox(t);
  const proc = await s.exec("i=0; while [ $i -lt 20 ]; do echo tick$i; i=$((i+1)); sleep 0.03; done", { background: true });
  let first;
  for await (const c of proc.output()) {
    first = c;
    break; // closes the reader, not the process
  }
  assert.ok(first.data.startsWith("tick0\n"));
  const again = await s.process(proc.id);
  assert.equal(again.pid, proc.pid);
  const rest = again.output({ offset: first.endOffset });
  assert.equal(first.data + text(await collect(rest)), Array.from({ length: 20 }, (_, i) => `tick${i}\n`).join(""));
  assert.equal(rest.info.exitCode, 0);

  const slow = await s.exec("echo started; sleep 30", { background: true });
  const deadline = Date.now() + 5000;
  while ((await slow.refresh()).outputBytes === 0 && Date.now() < deadline) await sleep(50);
  const now = slow.output({ follow: false });
  assert.equal(text(await collect(now)), "started\n");
  assert.equal(now.info.state, "running");
  assert.equal(now.exited, false);
  assert.equal(now.nextOffset, 8);
  await slow.kill();
});

test("stdin lines, then close", async (t) => {
  const s = await tmpSandbox(t);
  const proc = await s.exec("while read l; do echo got:$l; done; echo bye", { background: true });
  await proc.sendStdin("one\n");
  await proc.sendStdin(new TextEncoder().encode("two\n"));
  await proc.closeStdin();
  const info = await proc.wait({ timeoutSeconds: 10 });
  assert.deepEqual([info.state, info.exitCode, info.stdinOpen], ["exited", 0, false]);
  assert.equal(proc.exitCode, 0, "wait updates the Process");
  assert.equal(text(await collect(proc.output({ follow: false }))), "got:one\ngot:two\nbye\n");
  await assert.rejects(proc.sendStdin("late\n"), Conflict);
});

test("SIGTERM with a trap: the exit code the trap chose", async (t) => {
  const s = await tmpSandbox(t);
  const proc = await s.exec("trap 'echo term; exit 3' TERM; echo ready; while :; do sleep 0.1; done", { background: true });
  const out = proc.output();
  let seen = "";
  while (!seen.includes("ready")) seen += (await out.next()).value.data;
  const info = await proc.signal("SIGTERM");
  assert.equal(typeof info.pid, "number");
  seen += text(await collect(out));
  assert.ok(seen.includes("term\n"), seen);
  assert.deepEqual([out.info.exitCode, out.info.reason], [3, "exited"]);
  await assert.rejects(proc.signal("SIGSEGV"), BadRequest);
});

test("wait with a short timeout while it runs, then kill", async (t) => {
  const s = await tmpSandbox(t);
  const proc = await s.exec("setsid sleep 321 & exec sleep 322", { background: true });
  const t0 = Date.now();
  const info = await proc.wait({ timeoutMs: 1000 });
  const took = Date.now() - t0;
  assert.equal(info.state, "running");
  assert.ok(took >= 800 && took < 2500, String(took));
  const killed = await proc.kill();
  assert.deepEqual([killed.state, killed.reason, proc.reason], ["exited", "cancelled", "cancelled"]);
  assert.equal((await proc.wait()).reason, "cancelled");
  const left = (await s.exec("ps -eo args --no-headers | grep -c '^sleep 32[12]' || true")).stdout;
  assert.equal(left.trim(), "0", "the kill took everything it started");
});

test("a process id names a process in one sandbox only", async (t) => {
  const s = await tmpSandbox(t);
  const other = await tmpSandbox(t);
  const proc = await s.exec("sleep 30", { background: true });
  await assert.rejects(other.process(proc.id), (e) => e instanceof NotFound && e.status === 404 && e.code === "process_not_found");
  await assert.rejects(new Process(proc.info, other).kill(), NotFound);
  await assert.rejects(collect(new Process(proc.info, other).output()), NotFound);
  assert.deepEqual(await other.processes(), []);
  await assert.rejects(s.process("1234"), BadRequest);
  await assert.rejects(s.execStream("true", { background: true }), TypeError);
  assert.ok((await s.process(proc)).running);
  await proc.kill();
});

test("the 17th running process is RateLimited (too_many)", async (t) => {
  const s = await tmpSandbox(t);
  // too_many carries no Retry-After (docs/api.md, Errors): retrying soon
  // would fail the same way, so even a client with retries does not wait.
  const noRetry = new Sandbox(s.info, new Client({ url: URL, apiKey: KEY }));
  const procs = [];
  for (let i = 0; i < 16; i++) procs.push(await noRetry.exec(undefined, { argv: ["sleep", "60"], background: true }));
  await assert.rejects(noRetry.exec(undefined, { argv: ["sleep", "60"], background: true }),
    (e) => e instanceof RateLimited && e.status === 429 && e.code === "too_many" && e.retryAfter === undefined);
  await procs[0].kill();
  assert.match((await noRetry.exec("true", { background: true })).id, /^proc_/);
  assert.equal((await noRetry.processes()).length, 17);
});

test("output: base64 gives the exact bytes", async (t) => {
  const s = await tmpSandbox(t);
  const r = await s.exec("printf '\\377\\000'", { output: "base64" });
  assert.deepEqual(r.stdoutBytes, new Uint8Array([0xff, 0x00]));
  assert.deepEqual(r.stderrBytes, new Uint8Array());
  assert.equal(r.stdout, "\ufffd\u0000");
  const plain = await s.exec("printf '\\377'");
  assert.equal(plain.stdout, "\ufffd");
  assert.deepEqual(plain.stdoutBytes, new TextEncoder().encode("\ufffd"));
  const stream = await s.execStream("printf '\\377'; printf '\\001' >&2", { output: "base64" });
  const chunks = [];
  for await (const c of stream) chunks.push([c.stream, c.data]);
  assert.deepEqual(chunks, [["stdout", new Uint8Array([0xff])], ["stderr", new Uint8Array([1])]]);
  assert.deepEqual(stream.result.stdoutBytes, new Uint8Array([0xff]));
  const proc = await s.exec("printf '\\377\\000'", { background: true });
  const raw = await collect(proc.output({ encoding: "base64" }));
  assert.deepEqual(Buffer.concat(raw.map((c) => c.data)), Buffer.from([0xff, 0x00]));
  assert.equal(raw.at(-1).endOffset, 2);
});
