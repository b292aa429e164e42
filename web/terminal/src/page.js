// The page at /terminal/: #sandbox=ID&token=TOKEN (in the fragment, which
// is never sent to a server), optionally &cmd=... or &cwd=....
import { attachTerminal } from "./terminal.js";

const params = new URLSearchParams(location.hash.slice(1));
const sandbox = params.get("sandbox");
const token = params.get("token");
const el = document.getElementById("terminal");
const bar = document.getElementById("status");

const show = (text, kind) => {
  bar.textContent = text;
  bar.setAttribute("data-kind", kind);
};

if (!sandbox || !token) {
  show("Open this page as /terminal/#sandbox=ID&token=TOKEN, with a token from POST /v1/sandboxes/ID/pty/token.", "help");
} else {
  // The token works once; keep it out of the history.
  history.replaceState(null, "", `${location.pathname}#sandbox=${encodeURIComponent(sandbox)}`);
  window.hatcheryTerminal = attachTerminal(el, {
    sandbox,
    token,
    cmd: params.get("cmd") || undefined,
    cwd: params.get("cwd") || undefined,
    onStatus(state, detail) {
      if (state === "connecting") show(`connecting to ${sandbox}…`, "info");
      else if (state === "open") show(sandbox, "ok");
      else if (state === "exited" && detail.oom_killed) show(`exited with status ${detail.exit_code}: out of memory`, "error");
      else if (state === "exited") show(`exited with status ${detail.exit_code}`, "info");
      else if (state === "closed") show(`closed: ${detail.message || detail.reason || `code ${detail.code}`}`, "error");
      else if (state === "error") console.warn("terminal:", detail.message);
    },
  });
}
