// The reviewer page: one round's candidates, their runs as they happen,
// the full grading report, playback of the code's history (playback.js),
// replays with a fork button and a file viewer.
// It holds a reviewer token (from the URL fragment), never the API key.
import { call, el, grant } from "./api.js";
import { createPlayback } from "./playback.js";

const g = grant();
const R = `/v1/rounds/${encodeURIComponent(g.round)}`;
const $ = (id) => document.getElementById(id);
let selected = null;
let fork = null;
let timer = null;

function showError(e) {
  $("error").textContent = e ? (e.code ? `${e.code}: ${e.message}` : String(e.message || e)) : "";
}

// The code's history, loaded once per pick (and on Reload): the 2 s
// refresh below leaves it alone so it does not move a playhead.
const playback = createPlayback({
  token: g.token,
  base: () => `${R}/sessions/${encodeURIComponent(selected)}`,
  $,
  showError,
});

async function loadSessions() {
  const list = (await call(g.token, "GET", `${R}/sessions`)).sessions;
  const ul = $("sessions");
  ul.textContent = "";
  for (const s of list) {
    const res = s.result ? ` · ${s.result.passed}/${s.result.total}` : "";
    ul.append(el("li", { "data-id": s.id, "aria-current": String(s.id === selected), onclick: () => pick(s.id) }, `${s.candidate} — ${s.state}${res}`));
  }
}

function renderRuns(runs) {
  const tb = $("runs").querySelector("tbody");
  tb.textContent = "";
  runs.forEach((r, i) => {
    tb.append(el("tr", { "data-verdict": r.verdict }, el("td", {}, String(i + 1)), el("td", {}, r.created_at.slice(11, 19)),
      el("td", {}, r.verdict), el("td", {}, String(r.cpu_ms)), el("td", {}, String(r.wall_ms)), el("td", {}, String(r.exit_code))));
  });
}

function renderReport(rep) {
  const box = $("report");
  box.textContent = "";
  if (!rep.submissions.length) {
    box.textContent = "No submission yet.";
    return;
  }
  box.classList.remove("muted");
  for (const sub of rep.submissions) {
    box.append(el("div", { class: "muted" }, `Submission ${sub.submission_id} · ${sub.submitted_at} · sha256 ${sub.sha256.slice(0, 16)}…`));
    for (const gr of sub.gradings) {
      box.append(el("div", {}, el("strong", {}, `${gr.passed} / ${gr.total} passed`), ` (${gr.status}, ${gr.graded_at})`));
      if (gr.error) box.append(el("pre", { class: "out err" }, gr.error));
      for (const c of gr.cases) {
        const ms = c.cpu_ms != null ? ` · ${c.cpu_ms.toFixed(1)} ms CPU` : "";
        const d = el("div", { class: `case ${c.ok ? "ok" : "fail"}` }, `${c.ok ? "✓" : "✗"} ${c.name}${ms}`);
        if (c.detail) d.append(el("pre", {}, c.detail));
        box.append(d);
      }
    }
  }
}

function renderReplays(list) {
  const ul = $("replays");
  ul.textContent = "";
  for (const r of list) {
    const btn = el("button", { type: "button", onclick: () => makeFork(r.id) }, "Fork");
    if (r.state !== "active") btn.disabled = true;
    ul.append(el("li", { "data-id": r.id }, `${r.created_at.slice(0, 19)} · ${r.reason} · ${r.state} (until ${r.expires_at.slice(0, 19)})`, btn));
  }
}

async function refresh() {
  if (!selected) return;
  const S = `${R}/sessions/${encodeURIComponent(selected)}`;
  try {
    const [s, runs, rep, reps] = await Promise.all([
      call(g.token, "GET", S),
      call(g.token, "GET", `${S}/runs`),
      call(g.token, "GET", `${S}/report`),
      call(g.token, "GET", `${S}/replays`),
    ]);
    $("candidate").textContent = s.candidate;
    $("session-state").textContent = `state ${s.state} · expires ${s.expires_at}`;
    $("take-replay").disabled = s.state === "ended" || s.state === "preparing";
    renderRuns(runs.runs);
    renderReport(rep);
    renderReplays(reps.replays);
    document.body.dataset.loaded = selected;
  } catch (e) {
    showError(e);
  }
}

async function pick(id) {
  selected = id;
  $("detail").hidden = false;
  for (const li of $("sessions").children) li.setAttribute("aria-current", String(li.dataset.id === id));
  playback.stop();
  await Promise.all([refresh(), playback.load().catch(showError)]);
  clearInterval(timer);
  // The candidate's runs as they happen.
  timer = setInterval(refresh, 2000);
}

async function makeFork(replayId) {
  showError(null);
  try {
    fork = await call(g.token, "POST", `${R}/replays/${encodeURIComponent(replayId)}/forks`);
    $("fork").hidden = false;
    $("fork-id").textContent = fork.id;
    const tree = await call(g.token, "GET", `${R}/forks/${fork.id}/files`);
    const ul = $("fork-files");
    ul.textContent = "";
    $("fork-content").textContent = "";
    for (const p of tree.files) ul.append(el("li", { "data-path": p, onclick: () => showFile(p) }, p));
    document.body.dataset.fork = fork.id;
  } catch (e) {
    showError(e);
  }
}

async function showFile(p) {
  try {
    const c = await call(g.token, "GET", `${R}/forks/${fork.id}/file?path=${encodeURIComponent(p)}`);
    $("fork-content").textContent = c.content;
    $("fork-content").dataset.path = p;
  } catch (e) {
    showError(e);
  }
}

async function main() {
  if (!g.token || !g.round) {
    showError(new Error("this link is incomplete: it needs ?round=… and #token"));
    return;
  }
  try {
    const r = await call(g.token, "GET", R);
    $("round-name").textContent = `Review: ${r.name}`;
    $("round-state").textContent = r.state;
    await loadSessions();
    setInterval(() => loadSessions().catch(showError), 5000);
  } catch (e) {
    showError(e);
  }
  $("take-replay").addEventListener("click", async () => {
    try {
      await call(g.token, "POST", `${R}/sessions/${encodeURIComponent(selected)}/replays`);
      await refresh();
    } catch (e) {
      showError(e);
    }
  });
  $("fork-delete").addEventListener("click", async () => {
    if (!fork) return;
    try {
      await call(g.token, "DELETE", `${R}/forks/${fork.id}`);
      fork = null;
      $("fork").hidden = true;
    } catch (e) {
      showError(e);
    }
  });
  document.body.dataset.ready = "true";
}

main();
