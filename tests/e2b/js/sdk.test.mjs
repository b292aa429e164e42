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

test("issue 35: list filters, Template.exists, remove, gzip, metrics, signed URLs, pause bodies", async () => {
  const { Template } = await import(pathToFileURL(process.env.E2B_JS_MODULE).href);
  const t35 = `${tag}-35`;
  const a = await Sandbox.create("base", { metadata: { suite: t35 }, timeoutMs: 300_000 });
  let b;
  try {
    await new Promise((r) => setTimeout(r, 1100));
    const cut = new Date();
    b = await Sandbox.create("code-interpreter-v1", { metadata: { suite: t35 }, timeoutMs: 300_000 });
    const ids = async (q) =>
      (await Sandbox.list({ query: { metadata: { suite: t35 }, ...q } }).nextItems()).map((s) => s.sandboxId).sort();
    assert.deepEqual(await ids({}), [a.sandboxId, b.sandboxId].sort());
    assert.deepEqual(await ids({ startedAfter: cut }), [b.sandboxId]);
    assert.deepEqual(await ids({ template: "base" }), [a.sandboxId]);
    assert.deepEqual(await ids({ startedAfter: new Date(Date.now() + 3_600_000) }), []);

    assert.equal(await Template.exists("base"), true);
    assert.equal(await Template.exists("no-such-template"), false);

    await a.files.remove("/home/user/never-existed");
    const data = "gz".repeat(5000);
    await a.files.write("/home/user/gz.txt", data, { gzip: true });
    assert.equal(await a.files.read("/home/user/gz.txt"), data);

    const [m] = await a.getMetrics();
    assert.equal(m.cpuCount, 1);
    assert.equal(m.memTotal, 512 * 1024 * 1024);
    assert.ok(m.memUsed > 0 && m.diskUsed > 0, JSON.stringify(m));

    // Signed URLs, as the JS SDK builds them from E2B_SANDBOX_URL.
    const down = await a.downloadUrl("/home/user/gz.txt", { useSignatureExpiration: 60 });
    assert.equal(new URL(down).pathname, "/files");
    const got = await fetch(down);
    assert.equal(got.status, 200);
    assert.equal(await got.text(), data);
    const up = await a.uploadUrl("/home/user/up.txt");
    const form = new FormData();
    form.append("file", new Blob(["via url"]), "up.txt");
    assert.equal((await fetch(up, { method: "POST", body: form })).status, 200);
    assert.equal(await a.files.read("/home/user/up.txt"), "via url");
    const forged = new URL(down);
    forged.searchParams.set("path", "/home/user/up.txt");
    assert.equal((await fetch(forged)).status, 401);

    // A filesystem-only pause: the files come back, the processes do not.
    await a.commands.run("sleep 3600", { background: true });
    assert.equal(await a.pause({ keepMemory: false }), true);
    assert.equal((await a.getInfo()).state, "paused");
    const cold = await Sandbox.connect(a.sandboxId);
    assert.equal(await cold.files.read("/home/user/up.txt"), "via url");
    assert.ok(!(await cold.commands.list()).some((p) => [p.cmd, ...p.args].join(" ").includes("sleep 3600")));
    assert.equal(await cold.pause({ keepMemory: true }), true);
    const back = await Sandbox.connect(a.sandboxId);
    assert.equal(await back.files.read("/home/user/up.txt"), "via url");
  } finally {
    await Sandbox.kill(a.sandboxId);
    if (b) await b.kill();
  }
});

test("issue 35: snapshots (create, list, create from, delete)", async () => {
  const src = await Sandbox.create("base", { timeoutMs: 300_000 });
  try {
    await src.files.write("/home/user/snap.txt", "snapped");
    const snap = await src.createSnapshot({ name: `${tag}-snap` });
    assert.match(snap.snapshotId, /^snap_/);
    assert.deepEqual(snap.names, [`${tag}-snap`]);
    const listed = await src.listSnapshots().nextItems();
    assert.deepEqual(listed.map((s) => s.snapshotId), [snap.snapshotId]);
    const byName = await Sandbox.listSnapshots({ name: `${tag}-snap` }).nextItems();
    assert.deepEqual(byName.map((s) => s.snapshotId), [snap.snapshotId]);
    const copy = await Sandbox.create(snap.snapshotId, { timeoutMs: 120_000 });
    try {
      assert.equal(await copy.files.read("/home/user/snap.txt"), "snapped");
    } finally {
      await copy.kill();
    }
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true);
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false);
    assert.deepEqual(await src.listSnapshots().nextItems(), []);
  } finally {
    await src.kill();
  }
});

test("envd 0.6.4: file metadata, watch entries", async () => {
  const sbx = await Sandbox.create("base", { timeoutMs: 300_000 });
  try {
    const info = await sbx.files.write("/home/user/meta.txt", "m", { metadata: { Author: "js" } });
    assert.deepEqual(info.metadata, { author: "js" });
    assert.deepEqual((await sbx.files.getInfo("/home/user/meta.txt")).metadata, { author: "js" });
    const listed = await sbx.files.list("/home/user");
    assert.deepEqual(listed.find((e) => e.name === "meta.txt").metadata, { author: "js" });
    const cleared = await sbx.files.write("/home/user/meta.txt", "n");
    assert.equal(cleared.metadata, undefined);

    await sbx.files.makeDir("/home/user/wjs");
    let resolveWrite;
    const written = new Promise((r) => (resolveWrite = r));
    const h = await sbx.files.watchDir(
      "/home/user/wjs",
      (e) => { if (e.type === "write") resolveWrite(e); },
      { includeEntry: true, allowNetworkMounts: true },
    );
    await sbx.files.write("/home/user/wjs/f.txt", "x", { metadata: { k: "v" } });
    const e = await Promise.race([written, new Promise((_, no) => setTimeout(() => no(new Error("no write event")), 20_000))]);
    await h.stop();
    assert.equal(e.name, "f.txt");
    assert.equal(e.entry.path, "/home/user/wjs/f.txt");
    assert.deepEqual(e.entry.metadata, { k: "v" });
  } finally {
    await sbx.kill();
  }
});

test("issue 35: base has git, curl and sudo, and the git helpers work on it (remote: a bare repository in the sandbox)", async () => {
  const sbx = await Sandbox.create("base", { timeoutMs: 300_000 });
  try {
    assert.equal((await sbx.commands.run("command -v git curl sudo")).stdout, "/usr/bin/git\n/usr/bin/curl\n/usr/bin/sudo\n");
    const { git } = sbx;
    await git.configureUser("Sandbox Bot", "bot@example.com");
    await git.init("/home/user/remote.git", { bare: true, initialBranch: "main" });
    await git.init("/home/user/repo", { initialBranch: "main" });
    await sbx.files.write("/home/user/repo/a.txt", "one\n");
    let st = await git.status("/home/user/repo");
    assert.deepEqual(st.fileStatus.map((f) => [f.name, f.status]), [["a.txt", "untracked"]]);
    await git.add("/home/user/repo");
    await git.commit("/home/user/repo", "one", { authorName: "Sandbox Bot", authorEmail: "bot@example.com" });
    assert.equal((await git.status("/home/user/repo")).isClean, true);
    await git.createBranch("/home/user/repo", "feature");
    const b = await git.branches("/home/user/repo");
    assert.deepEqual([b.branches.sort(), b.currentBranch], [["feature", "main"], "feature"]);
    await git.checkoutBranch("/home/user/repo", "main");
    await git.remoteAdd("/home/user/repo", "origin", "/home/user/remote.git");
    await git.push("/home/user/repo", { remote: "origin", branch: "main" });
    st = await git.status("/home/user/repo");
    assert.equal(st.upstream, "origin/main");
    await git.clone("file:///home/user/remote.git", { path: "/home/user/clone" });
    assert.equal(await sbx.files.read("/home/user/clone/a.txt"), "one\n");
  } finally {
    await sbx.kill();
  }
});
