// Port previews (getUrl, portRequest, previewUrl) and terminals (pty),
// against the live daemon.
import assert from "node:assert/strict";
import { test } from "node:test";
import { AuthError, BadRequest, SandboxTimeout, ServerError, Terminal } from "../dist/index.js";
import { acceptFor, mask } from "../dist/ws.js";
import { KEY, URL, noLeftovers, sleep, tmpSandbox } from "./helpers.mjs";

noLeftovers();

async function startServer(s, port = 8000) {
  await s.files.write("/tmp/www/hello.txt", "hello from the sandbox\n");
  await s.exec(`cd /tmp/www && exec python3 -m http.server ${port} --bind 127.0.0.1`, { background: true });
  // The deadline is checked on every round, not only after an error: a
  // server that answers but never with 200 must fail the test, not hang it.
  const deadline = Date.now() + 20_000;
  let last = "no answer";
  while (Date.now() <= deadline) {
    try {
      const r = await s.portRequest(port, { path: "/" });
      await r.body?.cancel();
      if (r.status === 200) return;
      last = `status ${r.status}`;
    } catch (e) {
      if (!(e instanceof ServerError) || e.code !== "port_closed") throw e;
      last = e.code;
    }
    await sleep(200);
  }
  throw new Error(`server on port ${port} not up within 20 s (last: ${last})`);
}

test("the handshake's accept key and masking", () => {
  assert.equal(acceptFor("dGhlIHNhbXBsZSBub25jZQ=="), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
  const key = new Uint8Array([1, 2, 3, 4]);
  assert.equal(mask(mask(Buffer.from("hello world"), key), key).toString(), "hello world");
});

test("getUrl, portRequest and a preview URL without the key", async (t) => {
  const s = await tmpSandbox(t);
  await assert.rejects(s.portRequest(8000), (e) => e instanceof ServerError && e.status === 502 && e.code === "port_closed");
  await assert.rejects(s.previewUrl(0), BadRequest);

  await startServer(s);
  const url = s.getUrl(8000, { path: "/hello.txt" });
  assert.equal(url, `${URL}/v1/sandboxes/${s.id}/ports/8000/hello.txt`);
  const withKey = await fetch(url, { headers: { authorization: `Bearer ${KEY}` } });
  assert.equal(withKey.status, 200);
  assert.equal(await withKey.text(), "hello from the sandbox\n");
  const r = await s.portRequest(8000, { path: "hello.txt" });
  assert.equal(await r.text(), "hello from the sandbox\n");
  const missing = await s.portRequest(8000, { path: "/missing.txt" });
  assert.equal(missing.status, 404, "the guest server's own status comes back");
  await missing.body?.cancel();

  const p = await s.previewUrl(8000, { ttlSeconds: 600 });
  assert.equal(p.port, 8000);
  assert.equal(p.sandboxId, s.id);
  assert.ok(p.path.startsWith("/preview/") && p.path.endsWith("/") && p.url.endsWith(p.path) && p.expiresAt);
  const open = await fetch(p.url + "hello.txt");
  assert.equal(await open.text(), "hello from the sandbox\n");
  const token = p.path.split("/")[2];
  const bad = token.slice(0, -2) + (token.at(-2) === "A" ? "B" : "A") + token.at(-1);
  // Previews are on an origin of their own, not the API's.
  assert.ok(!p.url.startsWith(URL + "/"), p.url);
  const denied = await fetch(p.url.replace(token, bad) + "hello.txt");
  assert.equal(denied.status, 403);
  assert.equal((await denied.json()).error.code, "preview_denied");
});

test("a terminal: echo, resize, exit", async (t) => {
  const s = await tmpSandbox(t);
  const term = await s.pty({ cols: 100, rows: 30 });
  assert.ok(term instanceof Terminal);
  try {
    term.write("stty size\n");
    await term.readUntil("30 100", 15_000);
    term.write(new TextEncoder().encode("echo h''i\n"));
    await term.readUntil("hi\r\n", 15_000);
    // The guest answers each resize with the size the terminal reports
    // afterwards; once it said 120x40, every program there sees it.
    await term.resizeAndWait(120, 40, 15_000);
    assert.deepEqual(term.size, { cols: 120, rows: 40 });
    term.write("stty size\n");
    await term.readUntil("40 120", 15_000);
    await assert.rejects(term.resizeAndWait(0, 40, 15_000), (e) => e instanceof BadRequest && e.code === "invalid_resize");
    assert.deepEqual(term.size, { cols: 120, rows: 40 });
    term.write("exit\n");
    const ex = await term.wait({ timeoutMs: 15_000 });
    assert.equal(ex.exitCode, 0);
    assert.equal(ex.reason, "exited");
  } finally {
    await term.close();
  }
});

test("a terminal with cmd, a token, onData and the iterator; refusals", async (t) => {
  const s = await tmpSandbox(t);
  const tok = await s.ptyToken();
  assert.ok(tok.token && tok.expiresAt);
  const term = await s.pty({ cmd: "sleep 0.3; echo from-cmd; exit 3", cwd: "/tmp", token: tok.token });
  const seen = [];
  const off = term.onData((d) => seen.push(d));
  assert.equal((await term.wait({ timeoutMs: 15_000 })).exitCode, 3);
  off();
  assert.match(Buffer.concat(seen).toString(), /from-cmd/);
  await assert.rejects(s.pty({ token: tok.token }), AuthError, "a token is used up by its 101");
  await assert.rejects(s.pty({ cols: 0 }), BadRequest);

  const sh = await s.pty({ argv: ["/bin/sh"] });
  sh.write("echo iter''ok; exit\n");
  let out = "";
  for await (const d of sh) out += Buffer.from(d).toString();
  assert.match(out, /iterok/);
  assert.equal((await sh.wait()).exitCode, 0);
});
