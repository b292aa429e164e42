// The `e2b` npm package against a live daemon: run by test_js_sdk.py with
// E2B_API_URL / E2B_SANDBOX_URL / E2B_API_KEY set and E2B_JS_MODULE naming
// the installed package's ESM entry (target/e2b-js, installed by npm ci).
import assert from "node:assert/strict";
import { test } from "node:test";
import { pathToFileURL } from "node:url";

const { Sandbox, CommandExitError } = await import(pathToFileURL(process.env.E2B_JS_MODULE).href);
const tag = `js${Date.now()}`;

test("create, commands, files, pty, list, timeout, pause/resume, kill", async () => {
  const sbx = await Sandbox.create("base", { metadata: { suite: tag }, timeoutMs: 300_000 });
  try {
    const r = await sbx.commands.run("echo hi; whoami; echo err >&2");
    assert.equal(r.stdout, "hi\nuser\n");
    assert.equal(r.stderr, "err\n");
    await assert.rejects(sbx.commands.run("exit 4"), (e) => e instanceof CommandExitError && e.exitCode === 4);

    const bg = await sbx.commands.run("read x; echo got:$x", { background: true, stdin: true });
    await sbx.commands.sendStdin(bg.pid, "abc\n");
    assert.equal((await bg.wait()).stdout, "got:abc\n");
    const long = await sbx.commands.run("sleep 60", { background: true });
    assert.equal(await sbx.commands.kill(long.pid), true);

    await sbx.files.write("/home/user/js/a.txt", "hello");
    assert.equal(await sbx.files.read("/home/user/js/a.txt"), "hello");
    assert.deepEqual((await sbx.files.list("/home/user/js")).map((e) => e.name), ["a.txt"]);
    await sbx.files.rename("/home/user/js/a.txt", "/home/user/js/b.txt");
    assert.equal(await sbx.files.exists("/home/user/js/b.txt"), true);
    await sbx.files.remove("/home/user/js");
    assert.equal(await sbx.files.exists("/home/user/js"), false);

    let out = "";
    const pty = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += Buffer.from(d).toString(); } });
    await sbx.pty.sendInput(pty.pid, new TextEncoder().encode("echo pty-$((6*7)); exit 0\n"));
    await pty.wait();
    assert.match(out, /pty-42/);

    const found = await Sandbox.list({ query: { metadata: { suite: tag } } }).nextItems();
    assert.deepEqual(found.map((s) => s.sandboxId), [sbx.sandboxId]);
    await sbx.setTimeout(900_000);
    const info = await sbx.getInfo();
    assert.ok(info.endAt.getTime() - Date.now() > 600_000);

    await sbx.files.write("/home/user/keep.txt", "kept");
    assert.equal(await sbx.pause(), true);
    assert.equal((await sbx.getInfo()).state, "paused");
    const back = await Sandbox.connect(sbx.sandboxId);
    assert.equal(await back.files.read("/home/user/keep.txt"), "kept");
  } finally {
    await Sandbox.kill(sbx.sandboxId);
  }
  assert.equal(await Sandbox.kill(sbx.sandboxId), false);
});
