"""Playback on the reviewer page in headless Chromium against a real daemon
and real sandboxes: a candidate types, runs twice and submits in the live
room; the reviewer page then replays the code's history from the stored
log. Played to the end at a chosen speed, the file shown equals the final
document byte for byte; at each Run mark it equals what that Run ran (each
version prints its own marker, so the Run's stdout proves what ran) and
that Run's output is shown beside it. Screenshot:
target/test-artifacts/rounds-playback.png."""

import json
import os
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
ARTIFACTS = os.environ.get("HATCHERY_TEST_ARTIFACTS", os.path.join(REPO, "target/test-artifacts"))

V1 = "def add(a, b):\n    return a - b\n\nprint('v1', add(2, 3))\n"
V2 = "def add(a, b):\n    return a + b\n\nprint('v2', add(2, 3))\n"
# The final text: trailing spaces, a tab and non-ASCII, so "byte for byte"
# means something.
FINAL = V2 + "# tidy up \t\n# naïve → done\n"
TESTS = {"test_hidden.py": "from solution import add\n\ndef test_add():\n    assert add(2, 3) == 5\n"}


def type_to(b, text):
    """Turns solution.py into `text` a few characters per update, as typing
    would (each is its own entry of the log)."""
    cur = b.eval("window.hatcheryRoom.view().state.doc.toString()")
    # Keep the common prefix, delete the rest, then type the new tail.
    n = 0
    while n < min(len(cur), len(text)) and cur[n] == text[n]:
        n += 1
    b.eval(f"""(() => {{ const v = window.hatcheryRoom.view();
        v.dispatch({{changes: {{from: {len(cur[:n].encode('utf-16-le')) // 2}, to: v.state.doc.length, insert: ''}}}}); }})()""")
    tail = text[n:]
    for i in range(0, len(tail), 7):
        piece = tail[i:i + 7]
        b.eval(f"""(() => {{ const v = window.hatcheryRoom.view();
            v.dispatch({{changes: {{from: v.state.doc.length, insert: {json.dumps(piece)}}}}}); }})()""")
        time.sleep(0.02)
    b.wait(f"window.hatcheryRoom.view().state.doc.toString() === {json.dumps(text)}", what="typed")


def run(b, out):
    b.click("#run")
    b.wait(f"document.getElementById('stdout').textContent === {json.dumps(out)}", timeout=60, what=f"Run printing {out!r}")
    b.wait("!document.getElementById('run').disabled", what="Run done")


def pb(b, expr):
    return b.eval(f"document.getElementById('playback').{expr}")


def test_playback_replays_the_history_to_the_final_file_and_each_run(daemon, browser):
    d, b = daemon, browser
    r = d.request("POST", "/v1/rounds", {
        "name": "Playback: add",
        "starter_files": {"solution.py": "def add(a, b):\n    pass\n", "notes.md": "scratch\n"},
        "tests": {"files": TESTS}, "cpu_time_limit_ms": 2000})
    assert r.status == 201, r
    rid = r.json()["id"]
    inv = d.request("POST", f"/v1/rounds/{rid}/sessions", {"candidate": "lin@example.com"}).json()
    sid = inv["id"]
    S = f"/v1/rounds/{rid}/sessions/{sid}"
    try:
        b.goto(inv["url"])
        b.wait("document.body.dataset.ready === 'true'", what="room synced")
        b.eval("window.hatcheryRoom.select('solution.py')")
        type_to(b, V1)
        run(b, "v1 -1\n")
        type_to(b, V2)
        run(b, "v2 5\n")
        type_to(b, FINAL)
        b.click("#submit")
        b.wait("document.getElementById('result').dataset.passed === '1'", timeout=120, what="graded")
        assert not b.exceptions(), b.exceptions()

        tl = d.request("GET", f"{S}/timeline").json()["entries"]
        marks = [e for e in tl if e["kind"] in ("run", "submit")]
        assert [m["kind"] for m in marks] == ["run", "run", "submit"], marks
        assert sum(1 for e in tl if e["kind"] == "update") > 10, "typing made many entries"
        final = d.request("GET", f"{S}/document?at={tl[-1]['idx']}").json()["files"]
        assert final == {"solution.py": FINAL, "notes.md": "scratch\n"}

        rv = d.request("POST", f"/v1/rounds/{rid}/reviewer-tokens", {}).json()
        b.goto(rv["url"])
        b.wait("document.body.dataset.ready === 'true' && document.querySelectorAll('#sessions li').length === 1",
               what="review ready")
        b.click("#sessions li")
        b.wait("document.getElementById('playback').dataset.ready === 'true'", what="timeline loaded")
        assert int(pb(b, "dataset.entries")) == len(tl)
        marks_shown = b.eval("[...document.querySelectorAll('#pb-marks li')].map(li => [li.dataset.kind, li.dataset.ref])")
        assert marks_shown == [[m["kind"], m["ref_id"]] for m in marks], marks_shown
        b.click("#pb-files button[data-path='solution.py']")
        b.wait("document.getElementById('pb-content').dataset.path === 'solution.py'", what="solution tab")

        # Each Run mark: the file as that Run ran it, and that Run's output.
        runs = {x["run_id"]: x for x in d.request("GET", f"{S}/runs").json()["runs"]}
        for i, (want, out) in enumerate([(V1, "v1 -1\n"), (V2, "v2 5\n")]):
            ref = marks[i]["ref_id"]
            assert runs[ref]["stdout"] == out
            b.click(f"#pb-marks li[data-ref='{ref}'] button")
            b.wait(f"document.getElementById('playback').dataset.shown === '{marks[i]['idx']}'", what=f"Run {i + 1} mark")
            assert b.eval("document.getElementById('pb-content').textContent") == want
            assert b.eval("document.getElementById('pb-run').dataset.run") == ref
            assert b.eval("document.getElementById('pb-stdout').textContent") == out
            assert b.eval("document.getElementById('pb-verdict').textContent") == runs[ref]["verdict"]

        os.makedirs(ARTIFACTS, exist_ok=True)
        b.screenshot(os.path.join(ARTIFACTS, "rounds-playback.png"))

        # Scrub to the first entry: the starter, and no Run yet.
        b.eval("(() => { const s = document.getElementById('pb-scrub'); s.value = '0'; s.dispatchEvent(new Event('input')); })()")
        b.wait("document.getElementById('playback').dataset.shown === '0'", what="scrubbed to the seed")
        assert b.eval("document.getElementById('pb-content').textContent") == "def add(a, b):\n    pass\n"
        assert b.eval("document.getElementById('pb-run').hidden") is True

        # Play from the start at 4x to the end, recording what the pane
        # showed on the way (at least one state between the seed and the
        # end: it played, not jumped; how many more depends on how fast
        # the documents come on this machine, since playback skips ahead
        # to keep its pace).
        b.eval("""(() => { window.pbSeen = new Set();
            new MutationObserver(() => window.pbSeen.add(document.getElementById('pb-content').textContent))
              .observe(document.getElementById('pb-content'), {childList: true, characterData: true, subtree: true});
            const s = document.getElementById('pb-speed'); s.value = '4'; s.dispatchEvent(new Event('change')); })()""")
        b.click("#pb-play")
        b.wait("document.getElementById('playback').dataset.ended === 'true'", timeout=60, what="played to the end")
        assert pb(b, "dataset.shown") == str(tl[-1]["idx"])
        shown = b.eval("document.getElementById('pb-content').textContent")
        assert shown.encode() == FINAL.encode()
        assert b.eval("document.getElementById('pb-run').dataset.run") == marks[1]["ref_id"]
        seen = b.eval("[...window.pbSeen]")
        assert len(seen) >= 3, f"playback showed only {len(seen)} states: {seen}"
        # The other file is there too, unchanged.
        b.click("#pb-files button[data-path='notes.md']")
        b.wait("document.getElementById('pb-content').textContent === 'scratch\\n'", what="notes.md at the end")
        assert not b.exceptions(), b.exceptions()

        # The candidate's token cannot read the history.
        assert d.request("GET", f"{S}/timeline", auth=False,
                         headers={"Authorization": f"Bearer {inv['token']}"}).status == 403
    finally:
        d.request("POST", f"{S}/end")
