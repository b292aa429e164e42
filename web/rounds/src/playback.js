// Playback on the reviewer page: the room's code history on a timeline,
// from the daemon's stored log (GET …/timeline, GET …/document?at=idx; the
// server rebuilds the files from the stored updates, so what is shown is
// what the room held, never a client's copy). Scrub to any entry, play at
// a chosen speed, jump to each Run and Submit, and see the output of the
// last Run at or before the playhead (from GET …/runs).
import { call, el } from "./api.js";

// A pause longer than this in the log plays as this long, so a candidate
// who thought for ten minutes does not stall the replay.
const IDLE_CAP_MS = 2000;
// Documents fetched, per session, kept for scrubbing back and forth.
const CACHE_MAX = 500;

export function createPlayback({ token, base, $, showError }) {
  let entries = [];
  let vt = [];
  let runs = new Map();
  let pos = 0;
  let shown = -1;
  let path = null;
  let playing = false;
  let anchor = null;
  // Bumped by every stop: a play loop whose generation is gone ends.
  let gen = 0;
  let seq = 0;
  const cache = new Map();
  let loads = 0;

  async function docAt(i) {
    const idx = entries[i].idx;
    let d = cache.get(idx);
    if (!d) {
      d = await call(token, "GET", `${base()}/document?at=${idx}`);
      if (cache.size >= CACHE_MAX) cache.delete(cache.keys().next().value);
      cache.set(idx, d);
    }
    return d.files;
  }

  function lastRunAt(i) {
    for (let j = i; j >= 0; j--) if (entries[j].kind === "run") return j;
    return -1;
  }

  function renderFiles(files) {
    const names = Object.keys(files);
    if (!names.includes(path)) path = names[0] || null;
    const tabs = $("pb-files");
    tabs.textContent = "";
    for (const p of names) {
      tabs.append(el("button", { type: "button", "data-path": p, "aria-selected": String(p === path), onclick: () => {
        path = p;
        renderFiles(files);
      } }, p));
    }
    const pre = $("pb-content");
    pre.textContent = path === null ? "" : files[path];
    pre.dataset.path = path || "";
  }

  function renderRun(i) {
    const j = lastRunAt(i);
    const box = $("pb-run");
    if (j < 0) {
      box.hidden = true;
      box.dataset.run = "";
      return;
    }
    box.hidden = false;
    const e = entries[j];
    const r = runs.get(e.ref_id);
    box.dataset.run = e.ref_id || "";
    const n = entries.slice(0, j + 1).filter((x) => x.kind === "run").length;
    $("pb-run-title").textContent = `Run ${n} at ${e.at.slice(11, 19)}${j === i ? "" : " (the last Run before this point)"}`;
    $("pb-verdict").textContent = r ? r.verdict : "no result recorded";
    $("pb-verdict").className = `verdict ${r && r.verdict === "ok" ? "ok" : "bad"}`;
    $("pb-stdout").textContent = r ? r.stdout : "";
    $("pb-stderr").textContent = r ? r.stderr : "";
    $("pb-stderr").hidden = !(r && r.stderr);
  }

  // Shows entry i. Answers that arrive after a later call are dropped, so
  // a fast scrub ends on the entry it stopped at.
  async function show(i) {
    const my = ++seq;
    pos = i;
    $("pb-scrub").value = String(i);
    const e = entries[i];
    $("pb-pos").textContent = `${i + 1} / ${entries.length} · ${e.kind} · ${e.author} · ${e.at.slice(11, 19)}`;
    const files = await docAt(i);
    if (my !== seq) return;
    shown = i;
    renderFiles(files);
    renderRun(i);
    for (const m of $("pb-marks").children) m.setAttribute("aria-current", String(Number(m.dataset.i) === i));
    const root = $("playback");
    root.dataset.shown = String(e.idx);
    root.dataset.kind = e.kind;
  }

  function speed() {
    return Number($("pb-speed").value) || 1;
  }

  // Where the playhead is on the log's compressed time.
  function clock() {
    return anchor.v + (performance.now() - anchor.t) * anchor.s;
  }

  function stop() {
    gen++;
    playing = false;
    $("pb-play").textContent = "Play";
    $("playback").dataset.playing = "false";
  }

  // Plays from the playhead on a clock of the log's own (compressed) time:
  // each step shows the latest entry the clock has reached, so playback
  // keeps its pace even when a document takes longer to fetch than the gap
  // between two keystrokes (it skips the ones in between, never the last).
  async function play() {
    if (playing || !entries.length) return;
    if (pos >= entries.length - 1) pos = 0;
    playing = true;
    const mine = ++gen;
    const live = () => playing && mine === gen;
    $("pb-play").textContent = "Pause";
    $("playback").dataset.playing = "true";
    $("playback").dataset.ended = "false";
    anchor = { t: performance.now(), v: vt[pos], s: speed() };
    while (live()) {
      const now = clock();
      let target = pos;
      while (target + 1 < entries.length && vt[target + 1] <= now) target++;
      if (target !== pos || shown !== pos) {
        try {
          await show(target);
        } catch (e) {
          if (live()) {
            showError(e);
            stop();
          }
          return;
        }
      }
      if (!live()) return;
      if (pos >= entries.length - 1) {
        stop();
        $("playback").dataset.ended = "true";
        return;
      }
      const wait = Math.max(0, (vt[pos + 1] - clock()) / anchor.s);
      await new Promise((r) => setTimeout(r, Math.min(wait, 250)));
    }
  }

  function renderMarks() {
    const ol = $("pb-marks");
    ol.textContent = "";
    let n = 0;
    entries.forEach((e, i) => {
      if (e.kind !== "run" && e.kind !== "submit") return;
      const label = e.kind === "run" ? `Run ${++n}` : "Submit";
      ol.append(el("li", { "data-i": String(i), "data-kind": e.kind, "data-ref": e.ref_id || "" },
        el("button", { type: "button", onclick: () => jump(i) }, `${label} · ${e.at.slice(11, 19)}`)));
    });
  }

  async function jump(i) {
    stop();
    try {
      await show(i);
    } catch (e) {
      showError(e);
    }
  }

  async function load() {
    stop();
    cache.clear();
    seq++;
    shown = -1;
    const root = $("playback");
    root.dataset.ready = "false";
    root.dataset.ended = "false";
    const mine = ++loads;
    const [tl, rl] = await Promise.all([call(token, "GET", `${base()}/timeline`), call(token, "GET", `${base()}/runs`)]);
    // Another session was picked meanwhile: its load wins.
    if (mine !== loads) return;
    entries = tl.entries;
    runs = new Map(rl.runs.map((r) => [r.run_id, r]));
    vt = [];
    entries.forEach((e, i) => vt.push(i ? vt[i - 1] + Math.min(Math.max(e.at_ms - entries[i - 1].at_ms, 0), IDLE_CAP_MS) : 0));
    const scrub = $("pb-scrub");
    scrub.max = String(Math.max(entries.length - 1, 0));
    scrub.disabled = !entries.length;
    $("pb-play").disabled = !entries.length;
    renderMarks();
    if (entries.length) await show(entries.length - 1);
    else $("pb-pos").textContent = "no history yet";
    root.dataset.entries = String(entries.length);
    root.dataset.ready = "true";
  }

  $("pb-play").addEventListener("click", () => (playing ? stop() : play().catch(showError)));
  $("pb-speed").addEventListener("change", () => {
    // Keep the playhead where it is; only the pace changes from here on.
    if (playing) anchor = { t: performance.now(), v: clock(), s: speed() };
  });
  $("pb-scrub").addEventListener("input", () => jump(Number($("pb-scrub").value)));
  $("pb-reload").addEventListener("click", () => load().catch(showError));
  $("pb-start").addEventListener("click", () => jump(0));
  $("pb-end").addEventListener("click", () => entries.length && jump(entries.length - 1));
  return { load, stop };
}
