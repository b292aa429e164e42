// The candidate room: CodeMirror 6 editor with file tabs, Run (streamed
// over SSE, with the verdict), Submit (counts and failed case names only),
// and the sandbox's terminal. Everything goes through the candidate's
// capability token; the page never sees the API key.
import { EditorView, basicSetup } from "codemirror";
import { EditorState } from "@codemirror/state";
import { python } from "@codemirror/lang-python";
import { call, el, grant, stream } from "./api.js";

const g = grant();
const base = `/v1/rounds/${encodeURIComponent(g.round)}/sessions/${encodeURIComponent(g.session)}`;
const $ = (id) => document.getElementById(id);
const states = new Map();
let current = null;
let view = null;
let busy = false;

function showError(e) {
  $("error").textContent = e ? (e.code ? `${e.code}: ${e.message}` : String(e.message || e)) : "";
}

function stateFor(path, text) {
  const ext = path.endsWith(".py") ? [python()] : [];
  return EditorState.create({ doc: text, extensions: [basicSetup, ...ext] });
}

function select(path) {
  if (current && view) states.set(current, view.state);
  current = path;
  view.setState(states.get(path));
  for (const b of $("tabs").children) b.setAttribute("aria-selected", String(b.dataset.path === path));
}

function files() {
  if (current && view) states.set(current, view.state);
  const out = {};
  for (const [p, s] of states) out[p] = s.doc.toString();
  return out;
}

function setBusy(on, what) {
  busy = on;
  for (const id of ["run", "submit"]) $(id).disabled = on;
  $("busy").textContent = on ? what : "";
}

function showSession(s) {
  $("round-name").textContent = s.round_name;
  $("state").textContent = s.state;
  document.body.dataset.state = s.state;
  $("limits").textContent = `CPU limit ${s.cpu_time_limit_ms} ms · wall ${s.wall_time_limit_ms} ms · run: ${s.run.join(" ")} (${s.run_mode})`;
  const r = s.result;
  if (r) {
    const failed = r.failed_cases.length ? ` Failed: ${r.failed_cases.join(", ")}` : "";
    $("result").textContent = r.status === "error" ? "The grader could not run; your reviewer can regrade." : `${r.passed} / ${r.total} passed.${failed}`;
    $("result").dataset.passed = String(r.passed);
  }
  if (s.state === "ended") for (const id of ["run", "submit", "terminal-open"]) $(id).disabled = true;
}

async function run() {
  if (busy) return;
  showError(null);
  setBusy(true, "running…");
  $("stdout").textContent = "";
  $("stderr").textContent = "";
  $("verdict").textContent = "";
  $("verdict").className = "verdict";
  $("stats").textContent = "";
  try {
    await stream(g.token, `${base}/run/stream`, { files: files() }, (ev, data) => {
      if (ev === "stdout") $("stdout").textContent += data.data;
      else if (ev === "stderr") $("stderr").textContent += data.data;
      else if (ev === "result") {
        $("stdout").textContent = data.stdout;
        $("stderr").textContent = data.stderr;
        $("verdict").textContent = data.verdict;
        $("verdict").className = `verdict ${data.verdict === "ok" ? "ok" : "bad"}`;
        $("stats").textContent = `exit ${data.exit_code} · cpu ${data.cpu_ms} ms · wall ${data.wall_ms} ms · peak ${(data.memory_peak_bytes / 1048576).toFixed(1)} MiB`;
      } else if (ev === "error") showError(data.error);
    });
  } catch (e) {
    showError(e);
  } finally {
    setBusy(false);
  }
}

async function submit() {
  if (busy) return;
  showError(null);
  setBusy(true, "grading…");
  try {
    const acc = await call(g.token, "POST", `${base}/submit`, { files: files() });
    $("result").textContent = `Submitted (${acc.sha256.slice(0, 12)}…), grading…`;
    for (;;) {
      await new Promise((r) => setTimeout(r, 1000));
      const s = await call(g.token, "GET", base);
      if (s.result && s.result.submission_id === acc.submission_id) {
        showSession(s);
        break;
      }
      if (s.state === "ended") break;
    }
  } catch (e) {
    showError(e);
  } finally {
    setBusy(false);
  }
}

async function openTerminal() {
  showError(null);
  try {
    const t = await call(g.token, "POST", `${base}/terminal`);
    const box = $("terminal");
    box.hidden = false;
    box.textContent = "";
    // The daemon's own terminal module (xterm.js), not bundled twice.
    const mod = "/terminal/terminal.js";
    const { attachTerminal } = await import(mod);
    attachTerminal(box, { sandbox: t.sandbox_id, token: t.token, cwd: "/work" });
  } catch (e) {
    showError(e);
  }
}

async function main() {
  if (!g.token || !g.round || !g.session) {
    showError(new Error("this link is incomplete: it needs ?round=…&session=… and #token"));
    return;
  }
  view = new EditorView({ parent: $("editor") });
  try {
    const s = await call(g.token, "GET", base);
    showSession(s);
    const f = (await call(g.token, "GET", `${base}/files`)).files;
    // The file Run starts first, then the starter files, then the rest.
    const rank = (p) => (s.run.includes(p) ? 0 : s.files.includes(p) ? 1 : 2);
    const names = Object.keys(f).sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
    for (const p of names) {
      states.set(p, stateFor(p, f[p]));
      $("tabs").append(el("button", { type: "button", role: "tab", "data-path": p, onclick: () => select(p) }, p));
    }
    if (names.length) select(names[0]);
  } catch (e) {
    showError(e);
  }
  $("run").addEventListener("click", run);
  $("submit").addEventListener("click", submit);
  $("terminal-open").addEventListener("click", openTerminal);
  document.addEventListener("keydown", (e) => {
    if ((e.ctrlKey || e.metaKey) && e.key === "Enter") {
      e.preventDefault();
      run();
    }
  });
  // For tests and embedding pages: the editor and the tab switcher.
  window.hatcheryRoom = { view: () => view, select, files };
  document.body.dataset.ready = "true";
}

main();
