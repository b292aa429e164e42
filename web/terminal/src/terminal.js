// Hatchery browser terminal: xterm.js attached to a sandbox's PTY
// WebSocket (GET /v1/sandboxes/{id}/pty, protocol in docs/api.md).
//
//   import { attachTerminal } from "/terminal/terminal.js";
//   const t = attachTerminal(element, { sandbox: "sbx_...", token: "..." });
//
// `token` comes from POST /v1/sandboxes/{id}/pty/token, which your own
// backend calls with the API key (the key must never reach a page). A
// token opens one terminal, once, within 60 s of being made.
import { Terminal } from "@xterm/xterm";
import { FitAddon } from "@xterm/addon-fit";

const encoder = new TextEncoder();

/**
 * Opens a terminal in `element` and connects it.
 *
 * Options: sandbox (id, required), token (required unless the page's origin
 * authenticates otherwise), baseUrl (the daemon, default: this page's
 * origin), cmd or argv (instead of the login shell), cwd, env (object),
 * terminal (xterm.js options), onStatus(state, detail) where state is
 * "connecting", "open", "exited" (detail: the exit message), "closed"
 * (detail: {code, reason, message}) or "error" (detail: a refused control
 * message), and onOom(kills) when processes of the sandbox were killed for
 * memory (a line about it is also written into the terminal).
 *
 * Returns {term, socket, fit, close(), state()}.
 */
export function attachTerminal(element, opts) {
  if (!opts || !opts.sandbox) throw new Error("attachTerminal: sandbox is required");
  const term = new Terminal({ cursorBlink: true, scrollback: 5000, ...(opts.terminal || {}) });
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.open(element);
  try {
    fit.fit();
  } catch (_) {
    // Not laid out yet: the server's default size applies until a resize.
  }

  let state = "connecting";
  let closedBy = null;
  const status = (s, detail) => {
    state = s;
    element.setAttribute("data-state", s);
    if (opts.onStatus) opts.onStatus(s, detail);
  };

  const url = new URL(`/v1/sandboxes/${encodeURIComponent(opts.sandbox)}/pty`, opts.baseUrl || location.href);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  const q = url.searchParams;
  q.set("cols", String(term.cols));
  q.set("rows", String(term.rows));
  if (opts.token) q.set("token", opts.token);
  if (opts.cmd) q.set("cmd", opts.cmd);
  if (opts.argv) q.set("argv", JSON.stringify(opts.argv));
  if (opts.cwd) q.set("cwd", opts.cwd);
  if (opts.env) q.set("env", JSON.stringify(opts.env));

  const socket = new WebSocket(url.toString());
  socket.binaryType = "arraybuffer";
  // Keystrokes typed before the socket opened are sent once it has.
  const queued = [];
  const send = (data) => {
    if (socket.readyState === WebSocket.OPEN) socket.send(data);
    else if (socket.readyState === WebSocket.CONNECTING) queued.push(data);
  };
  status("connecting");

  socket.onopen = () => {
    for (const d of queued.splice(0)) socket.send(d);
    status("open");
    term.focus();
  };
  socket.onmessage = (ev) => {
    if (typeof ev.data !== "string") {
      term.write(new Uint8Array(ev.data));
      return;
    }
    let msg;
    try {
      msg = JSON.parse(ev.data);
    } catch (_) {
      return;
    }
    if (msg.type === "exit") {
      closedBy = msg;
      status("exited", msg);
    } else if (msg.type === "oom") {
      // The guest's shell says nothing when its child is killed for memory
      // (it sees exit status 1), so the page says it.
      term.write(`\r\n\x1b[33m[hatchery] a process in this sandbox was killed: out of memory (${msg.kills} so far)\x1b[0m\r\n`);
      if (opts.onOom) opts.onOom(msg.kills);
    } else if (msg.type === "closed") {
      closedBy = msg;
    } else if (msg.type === "error") {
      status("error", msg);
      status("open");
    }
  };
  socket.onclose = (ev) => {
    if (state === "exited") return;
    const detail = { code: ev.code, reason: (closedBy && closedBy.reason) || ev.reason, message: closedBy && closedBy.message };
    status("closed", detail);
  };

  term.onData((d) => send(encoder.encode(d)));
  // Mouse reports in the legacy encoding: one byte per character.
  term.onBinary((d) => send(Uint8Array.from(d, (c) => c.charCodeAt(0) & 0xff)));
  term.onResize(({ cols, rows }) => send(JSON.stringify({ type: "resize", cols, rows })));

  const refit = () => {
    try {
      fit.fit();
    } catch (_) {
      // Hidden or detached: nothing to fit.
    }
  };
  const observer = typeof ResizeObserver === "function" ? new ResizeObserver(refit) : null;
  if (observer) observer.observe(element);
  else window.addEventListener("resize", refit);

  const close = () => {
    if (observer) observer.disconnect();
    else window.removeEventListener("resize", refit);
    window.removeEventListener("pagehide", close);
    if (socket.readyState <= WebSocket.OPEN) socket.close(1000, "closed by the page");
  };
  // Leaving the page ends the terminal (and everything started in it).
  // Without this, a browser that keeps the page in its back/forward cache
  // keeps the socket, and the terminal, open.
  window.addEventListener("pagehide", close);

  return { term, socket, fit, state: () => state, close };
}
