// The candidate room: CodeMirror 6 editor with file tabs, Run (streamed
// over SSE, with the verdict), Submit (counts and failed case names only),
// and the sandbox's terminal. The files are the room's shared Yjs document
// (y-codemirror.next), kept by the daemon: an interviewer (`&role=
// interviewer`, their token) sees the same text and cursors, every Run's
// output as it streams, keeps private notes, and types while pairing is
// on. Everything goes through the caller's capability token; the page
// never sees the API key.
import { EditorView, basicSetup } from "codemirror";
import { Compartment, EditorState } from "@codemirror/state";
import { python } from "@codemirror/lang-python";
import * as Y from "yjs";
import { Awareness } from "y-protocols/awareness";
import { yCollab } from "y-codemirror.next";
import { call, el, grant, stream } from "./api.js";
import { connectRoom } from "./live.js";

const g = grant();
const interviewer = new URLSearchParams(location.search).get("role") === "interviewer";
const ydoc = new Y.Doc();
const yfiles = ydoc.getMap("files");
const awareness = new Awareness(ydoc);
const editable = new Compartment();
let pairing = false;
let link = null;
const base = `/v1/rounds/${encodeURIComponent(g.round)}/sessions/${encodeURIComponent(g.session)}`;
const $ = (id) => document.getElementById(id);
const states = new Map();
let current = null;
let view = null;
let busy = false;

function showError(e) {
  $("error").textContent = e ? (e.code ? `${e.code}: ${e.message}` : String(e.message || e)) : "";
}

function canType() {
  return !interviewer || pairing;
}

function stateFor(path) {
  const ext = path.endsWith(".py") ? [python()] : [];
  const ytext = yfiles.get(path);
  return EditorState.create({
    doc: ytext.toString(),
    extensions: [basicSetup, ...ext, yCollab(ytext, awareness), editable.of(EditorView.editable.of(canType()))],
  });
}

function select(path) {
  if (current && view) states.set(current, view.state);
  current = path;
  view.setState(states.get(path));
  for (const b of $("tabs").children) b.setAttribute("aria-selected", String(b.dataset.path === path));
}

// The room's files (the daemon runs and submits its own copy of them).
function files() {
  const out = {};
  for (const [p, t] of yfiles.entries()) if (t instanceof Y.Text) out[p] = t.toString();
  return out;
}

function setPairing(on) {
  pairing = on;
  if (view) view.dispatch({ effects: editable.reconfigure(EditorView.editable.of(canType())) });
  for (const [p, st] of states) if (p !== current) states.set(p, stateFor(p));
  $("pairing").checked = on;
}

// Room events: everyone sees each Run's output as it streams.
function onRoomEvent(ev) {
  if (ev.event === "pairing") setPairing(ev.pairing);
  if (!interviewer) return;
  if (ev.event === "run_started") {
    $("stdout").textContent = "";
    $("stderr").textContent = "";
    $("verdict").textContent = "";
    $("stats").textContent = "";
  } else if (ev.event === "stdout") $("stdout").textContent += ev.data;
  else if (ev.event === "stderr") $("stderr").textContent += ev.data;
  else if (ev.event === "run_result") showResult(ev.data);
}

function showResult(data) {
  $("stdout").textContent = data.stdout;
  $("stderr").textContent = data.stderr;
  $("verdict").textContent = data.verdict;
  $("verdict").className = `verdict ${data.verdict === "ok" ? "ok" : "bad"}`;
  $("stats").textContent = `exit ${data.exit_code} · cpu ${data.cpu_ms} ms · wall ${data.wall_ms} ms · peak ${(data.memory_peak_bytes / 1048576).toFixed(1)} MiB`;
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
    if (link) await link.flush();
    await stream(g.token, `${base}/run/stream`, { files: files() }, (ev, data) => {
      if (ev === "stdout") $("stdout").textContent += data.data;
      else if (ev === "stderr") $("stderr").textContent += data.data;
      else if (ev === "result") showResult(data);
      else if (ev === "error") showError(data.error);
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
    if (link) await link.flush();
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
  document.body.dataset.role = interviewer ? "interviewer" : "candidate";
  awareness.setLocalStateField("user", {
    name: interviewer ? "interviewer" : "candidate",
    color: interviewer ? "#b5179e" : "#1d6fd8",
    colorLight: interviewer ? "#b5179e33" : "#1d6fd833",
  });
  let s = null;
  try {
    s = await call(g.token, "GET", base);
    showSession(s);
  } catch (e) {
    showError(e);
    return;
  }
  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  let tabsMade = false;
  link = connectRoom({
    url: `${proto}//${location.host}${base}/room`,
    token: g.token,
    doc: ydoc,
    awareness,
    onEvent: onRoomEvent,
    onStatus: (st) => {
      document.body.dataset.room = st;
    },
    onSynced: () => {
      if (tabsMade) return;
      tabsMade = true;
      // The file Run starts first, then the starter files, then the rest.
      const rank = (p) => (s.run.includes(p) ? 0 : s.files.includes(p) ? 1 : 2);
      const names = [...yfiles.keys()].sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
      for (const p of names) {
        states.set(p, stateFor(p));
        $("tabs").append(el("button", { type: "button", role: "tab", "data-path": p, onclick: () => select(p) }, p));
      }
      if (names.length) select(names[0]);
      document.body.dataset.ready = "true";
    },
  });
  if (interviewer) {
    for (const id of ["run", "submit", "terminal-open"]) $(id).hidden = true;
    $("interviewer").hidden = false;
    try {
      $("notes").value = (await call(g.token, "GET", `${base}/notes`)).text;
    } catch (e) {
      showError(e);
    }
    $("notes-save").addEventListener("click", async () => {
      try {
        const n = await call(g.token, "PUT", `${base}/notes`, { text: $("notes").value });
        $("notes-saved").textContent = `saved ${n.updated_at}`;
      } catch (e) {
        showError(e);
      }
    });
    $("pairing").addEventListener("change", async () => {
      try {
        await call(g.token, "POST", `${base}/room/pairing`, { pairing: $("pairing").checked });
      } catch (e) {
        showError(e);
      }
    });
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
  // For tests and embedding pages: the editor, the tab switcher, the
  // shared document and a way to drop the connection.
  window.hatcheryRoom = { view: () => view, select, files, doc: ydoc, drop: () => link && link.drop() };
}

main();
