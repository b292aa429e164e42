// runCode and code contexts (the E2B code interpreter's surface), and the
// exec fields that came with them (reason, contained, cpuLimitMs). The default
// context is already running in every sandbox, so each run takes
// milliseconds; only the timeout test waits (2 s).
import assert from "node:assert/strict";
import { test } from "node:test";
import { BadRequest, Client, Execution, NotFound, Result, Sandbox, StreamError, TooLarge } from "../dist/index.js";
import { KEY, PROXY, noLeftovers, tmpSandbox } from "./helpers.mjs";

noLeftovers();

const CARD = `
class Card:
    def _repr_html_(self):
        return "<b>card</b>"
    def _repr_markdown_(self):
        return "**card**"
    def _repr_json_(self):
        return {"kind": "card", "n": [1, 2]}
    def __repr__(self):
        return "Card()"
display(Card())
`;

test("logs, the main result, and state across runs", async (t) => {
  const s = await tmpSandbox(t);
  const ex = await s.runCode("x = 41\nprint('hi')\nx + 1");
  assert.ok(ex instanceof Execution);
  assert.deepEqual(ex.logs, { stdout: ["hi\n"], stderr: [] });
  assert.equal(ex.text, "42");
  assert.equal(ex.results.length, 1);
  assert.ok(ex.results[0] instanceof Result && ex.results[0].isMainResult);
  assert.equal(ex.error, undefined);
  assert.ok(ex.ok);
  assert.deepEqual([ex.reason, ex.restarted, ex.truncated, ex.oomKilled, ex.contextId], ["exited", false, false, false, "default"]);
  assert.ok(ex.durationMs >= 0 && ex.cpuMs >= 0);
  assert.ok(ex.memoryPeakBytes == null || ex.memoryPeakBytes > 0);
  const again = await s.runCode("import sys\nprint('err', file=sys.stderr)\nx");
  assert.equal(again.text, "41");
  assert.deepEqual(again.logs.stderr, ["err\n"]);
  assert.equal(again.executionCount, ex.executionCount + 1);
  const quiet = await s.runCode("import os\nprint(os.environ['GREETING'])", { envs: { GREETING: "hello" } });
  assert.deepEqual([quiet.results, quiet.text, quiet.logs.stdout], [[], undefined, ["hello\n"]]);
  assert.equal((await s.runCode("import os\nrepr(os.environ.get('GREETING'))")).text, "'None'");
});

test("rich results: display() of an object with _repr_html_", async (t) => {
  const s = await tmpSandbox(t);
  const ex = await s.runCode(`${CARD}Card()`);
  assert.deepEqual(ex.results.map((r) => r.isMainResult), [false, true]);
  const shown = ex.results[0];
  assert.equal(shown.html, "<b>card</b>");
  assert.equal(shown.markdown, "**card**");
  assert.equal(shown.text, "Card()");
  assert.deepEqual(shown.json, { kind: "card", n: [1, 2] });
  assert.equal(shown.png, undefined);
  assert.deepEqual(shown.formats().sort(), ["html", "json", "markdown"]);
  assert.equal(shown.data["text/html"], "<b>card</b>");
  assert.equal(String(shown), "Card()");
  assert.equal(ex.text, "Card()");
  assert.deepEqual((await s.runCode("42")).results[0].formats(), []);
});

test("an exception is Execution.error, not a rejection", async (t) => {
  const s = await tmpSandbox(t);
  const ex = await s.runCode("print('before')\n1 / 0");
  assert.equal(ex.error.name, "ZeroDivisionError");
  assert.equal(ex.error.value, "division by zero");
  assert.match(ex.error.traceback, /Traceback[\s\S]*1 \/ 0/);
  assert.deepEqual([ex.logs.stdout, ex.results, ex.text, ex.reason, ex.ok], [["before\n"], [], undefined, "exited", false]);
  assert.equal((await s.runCode("'still here'")).text, "'still here'");
});

test("a streamed run calls back in order, as the output comes", async (t) => {
  const s = await tmpSandbox(t);
  const events = [];
  const t0 = Date.now();
  const ex = await s.runCode("import sys, time\nprint('one', flush=True)\ntime.sleep(0.4)\nprint('two', file=sys.stderr)\ndisplay(7)\n8", {
    onStdout: (d) => events.push(["stdout", d, Date.now()]),
    onStderr: (d) => events.push(["stderr", d, Date.now()]),
    // An async callback is awaited before the next event.
    onResult: async (r) => { await new Promise((res) => setTimeout(res, 5)); events.push(["result", r, Date.now()]); },
  });
  const done = Date.now();
  // print() writes its text and its newline separately: one chunk each.
  const kinds = events.map((e) => e[0]).filter((k, i, a) => i === 0 || a[i - 1] !== k || k === "result");
  assert.deepEqual(kinds, ["stdout", "stderr", "result", "result"]);
  assert.equal(events.filter((e) => e[0] === "stdout").map((e) => e[1]).join(""), "one\n");
  assert.equal(events.filter((e) => e[0] === "stderr").map((e) => e[1]).join(""), "two\n");
  const [shown, main] = events.slice(-2).map((e) => e[1]);
  assert.ok(shown instanceof Result && shown.text === "7" && !shown.isMainResult && main.isMainResult);
  assert.ok(events[0][2] - t0 < done - t0 - 300, "stdout came as printed, well before the end");
  assert.equal(ex.logs.stdout.join(""), "one\n");
  assert.equal(ex.text, "8");
  assert.deepEqual(ex.results.map((r) => r.text), ["7", "8"]);

  const errs = [];
  const failed = await s.runCode("raise KeyError('k')", { onError: (e) => errs.push(e) });
  assert.deepEqual(errs.map((e) => e.name), ["KeyError"]);
  assert.equal(failed.error.value, "'k'");

  // A callback that throws cancels the run and rejects.
  await assert.rejects(s.runCode("print('x')", { onStdout: () => { throw new Error("callback failed"); } }), /callback failed/);
});

test("contexts: separate, restartable, removable", async (t) => {
  const s = await tmpSandbox(t);
  await s.runCode("shared = 'default'");
  const ctx = await s.createCodeContext({ cwd: "/tmp" });
  assert.match(ctx.id, /^ctx_/);
  assert.deepEqual([ctx.language, ctx.cwd, ctx.executionCount], ["python", "/tmp", 0]);
  const ex = await s.runCode("shared", { context: ctx });
  assert.equal(ex.error.name, "NameError");
  assert.equal(ex.contextId, ctx.id);
  assert.equal((await s.runCode("import os\nos.getcwd()", { context: ctx })).text, "'/tmp'");
  await s.runCode("mine = 1", { context: ctx.id }); // an id works as well
  assert.equal((await s.runCode("mine")).error.name, "NameError");
  assert.equal((await s.runCode("shared")).text, "'default'");
  const listed = Object.fromEntries((await s.listCodeContexts()).map((c) => [c.id, c]));
  assert.deepEqual(Object.keys(listed).sort(), [ctx.id, "default"].sort());
  assert.equal(listed[ctx.id].executionCount, 3);

  const restarted = await s.restartCodeContext(ctx);
  assert.equal(restarted.id, ctx.id);
  assert.equal(restarted.executionCount, 0);
  assert.equal((await s.runCode("mine", { context: ctx })).error.name, "NameError");

  await s.removeCodeContext(ctx);
  await assert.rejects(s.runCode("1", { context: ctx }), (e) => e instanceof NotFound && e.code === "context_not_found");
  // The stream reports it as a `failed` event: the same error.
  await assert.rejects(s.runCode("1", { context: ctx, onStdout: () => {} }), (e) => e instanceof NotFound && e.code === "context_not_found");
  await assert.rejects(s.restartCodeContext(ctx.id), NotFound);
  await assert.rejects(s.removeCodeContext("default"), BadRequest);
  assert.deepEqual((await s.listCodeContexts()).map((c) => c.id), ["default"]);
});

test("bad requests: language, size, limits", async (t) => {
  const s = await tmpSandbox(t);
  await assert.rejects(s.runCode("1", { language: "cobol" }), (e) => e instanceof BadRequest && e.status === 400);
  await assert.rejects(s.createCodeContext({ language: "cobol" }), BadRequest);
  await assert.rejects(s.runCode("#".repeat(256 * 1024 + 1)), (e) => e instanceof TooLarge && e.status === 413 && e.code === "too_large");
  assert.ok((await s.runCode("#".repeat(256 * 1024))).ok);
  await assert.rejects(s.runCode("1", { timeoutSeconds: 2, cpuLimitMs: 2001 }), BadRequest);
  await assert.rejects(s.runCode("1", { timeoutSeconds: 2, timeoutMs: 2000 }), TypeError);
});

test("a timeout restarts the context; the next run works", async (t) => {
  const s = await tmpSandbox(t);
  await s.runCode("before = 1");
  const t0 = Date.now();
  const ex = await s.runCode("while True: pass", { timeoutMs: 2000 });
  assert.equal(ex.reason, "timeout");
  assert.equal(ex.restarted, true);
  assert.ok(Date.now() - t0 >= 1900 && Date.now() - t0 < 10_000);
  const after = await s.runCode("'alive'");
  assert.ok(after.ok && after.text === "'alive'");
  assert.equal((await s.runCode("before")).error.name, "NameError");
  const cpu = await s.runCode("while True: pass", { cpuLimitMs: 300 });
  assert.deepEqual([cpu.reason, cpu.restarted], ["cpu_limit", true]);
  assert.equal((await s.runCode("1 + 1")).text, "2");
});

test("exec: reason, contained, cpuLimitMs", async (t) => {
  const s = await tmpSandbox(t);
  const r = await s.exec("echo hi");
  assert.deepEqual([r.reason, r.contained, r.exitCode], ["exited", true, 0]);
  assert.ok(r.memoryPeakBytes == null || Number.isInteger(r.memoryPeakBytes));
  const cpu = await s.exec("python3 -c 'while True: pass'", { cpuLimitMs: 300, timeoutSeconds: 10 });
  assert.deepEqual([cpu.reason, cpu.exitCode, cpu.timedOut], ["cpu_limit", 137, false]);
  assert.ok(cpu.cpuMs >= 250);
  assert.equal((await s.exec("kill -TERM $$")).reason, "signaled");
  assert.equal((await s.exec("yes", { maxOutputBytes: 1000 })).reason, "output_limit");
  const streamed = await (await s.execStream("python3 -c 'while True: pass'", { cpuLimitMs: 200 })).wait();
  assert.equal(streamed.reason, "cpu_limit");
  assert.equal(streamed.contained, true);
});

test("a code stream that ends without done throws StreamError", async (t) => {
  const s = await tmpSandbox(t);
  const cut = new Sandbox(s.info, new Client({ url: `${PROXY}/cut/40`, apiKey: KEY }));
  await assert.rejects(cut.runCode("import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.2)", { onStdout: () => {} }), StreamError);
});
