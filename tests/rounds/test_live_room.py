"""The live room in headless Chromium against a real daemon and real
sandboxes: a candidate and two interviewers in one room. Typing on one
page appears on the others (the latency is printed, not asserted: figures
belong in `make bench`); a candidate's Run streams to the interviewers;
notes never reach the candidate's page or API; a candidate who drops and
rejoins loses nothing; Submit grades exactly the server's document; and
playback (the timeline and the document at each entry) reproduces the
file at the Run and at the Submit byte for byte."""

import json
import time

import cdp

SOLUTION = "def add(a, b):\n    return a + b\n\nprint('sum', add(2, 3))\n"
TESTS = {"test_hidden.py": "from solution import add\n\ndef test_add():\n    assert add(2, 3) == 5\n"}
NOTE = "SECRET-NOTE-" + "7f3a: strong on edge cases"


def files_expr():
    return "JSON.stringify(window.hatcheryRoom.files())"


def page_files(b):
    return json.loads(b.eval(files_expr()))


def replace_all(b, text):
    b.eval(f"""(() => {{ const v = window.hatcheryRoom.view();
        v.dispatch({{changes: {{from: 0, to: v.state.doc.length, insert: {json.dumps(text)}}}}}); }})()""")


def insert_at_end(b, text):
    b.eval(f"""(() => {{ const v = window.hatcheryRoom.view();
        v.dispatch({{changes: {{from: v.state.doc.length, insert: {json.dumps(text)}}}}}); }})()""")


def wait_file(b, path, text, what, timeout=20):
    b.wait(f"window.hatcheryRoom.files()[{json.dumps(path)}] === {json.dumps(text)}", timeout=timeout, what=what)


# Keystrokes each typist sends per round of typing.
KEYS = 30

# On a page: the time each keystroke marker (`#k<n>.`) first reaches its
# copy of solution.py, whoever typed it (the sender's own entry is ignored).
ARRIVALS = """(() => { window.kArrive = {};
  const t = window.hatcheryRoom.doc.getMap('files').get('solution.py');
  t.observe((ev) => { const now = performance.timeOrigin + performance.now();
    for (const d of ev.delta) if (typeof d.insert === 'string')
      for (const m of d.insert.matchAll(/#k(\\d+)\\./g)) if (!(m[1] in window.kArrive)) window.kArrive[m[1]] = now; });
})()"""


def send_key(b, k):
    """Types keystroke k at the end of solution.py; returns when it was sent."""
    return b.eval(f"""(() => {{ const v = window.hatcheryRoom.view(); const t0 = performance.timeOrigin + performance.now();
        v.dispatch({{changes: {{from: v.state.doc.length, insert: '#k{k}.\\n'}}}}); return t0; }})()""")


def type_and_measure(typists, pages, text, first, n, delays):
    """Each typist in turn sends n keystrokes ~20 ms apart; waits until every
    other page has each, and appends each arrival's delay (ms) to delays."""
    sent = {}
    k = first
    for b in typists:
        # Each types at the end of what it has: wait until that is the
        # whole text so far, so the order of the merged text is known.
        wait_file(b, "solution.py", text, "the previous typist's keystrokes", timeout=30)
        for _ in range(n):
            k += 1
            sent[k] = (b, send_key(b, k))
            text += f"#k{k}.\n"
            time.sleep(0.02)
    for b in pages:
        wait_file(b, "solution.py", text, "every keystroke on every page", timeout=30)
    for b in pages:
        got = json.loads(b.eval("JSON.stringify(window.kArrive)"))
        for kk, (src, t0) in sent.items():
            if src is not b:
                delays.append(got[str(kk)] - t0)
    return text


def pct(xs, p):
    return xs[min(len(xs) - 1, int(len(xs) * p / 100))]


def test_candidate_and_interviewers_share_the_room(daemon):
    d = daemon
    r = d.request("POST", "/v1/rounds", {
        "name": "Live: add",
        "starter_files": {"solution.py": "def add(a, b):\n    pass\n", "notes.md": "scratch\n"},
        "tests": {"files": TESTS}, "cpu_time_limit_ms": 2000})
    assert r.status == 201, r
    rid = r.json()["id"]
    inv = d.request("POST", f"/v1/rounds/{rid}/sessions", {"candidate": "ada@example.com"}).json()
    sid, cand_token = inv["id"], inv["token"]
    it = d.request("POST", f"/v1/rounds/{rid}/interviewer-tokens", {})
    assert it.status == 201, it
    it_token = it.json()["token"]
    base = f"http://127.0.0.1:{d.port}/rounds/room/?round={rid}&session={sid}"
    pages = []
    try:
        cand = cdp.Browser(width=1280, height=900)
        pages.append(cand)
        ints = []
        for _ in range(2):
            b = cdp.Browser(width=1280, height=900)
            pages.append(b)
            ints.append(b)
        cand.goto(inv["url"])
        for b in ints:
            b.goto(f"{base}&role=interviewer#{it_token}")
        for b in pages:
            b.wait("document.body.dataset.ready === 'true'", what="room synced")
        assert ints[0].eval("document.body.dataset.role") == "interviewer"
        assert ints[0].eval("document.getElementById('run').hidden") is True

        # Typing on one page appears on the others: the candidate types
        # first; then, pairing on, each of the three types in turn. Each
        # keystroke's delay (sent on one page to applied in another page's
        # document, on the pages' own clocks: Chromium processes on one
        # machine) is printed as p50/p99, not asserted (the 200 ms target
        # is checked in `make bench`, bench/room_bench.py).
        for b in pages:
            b.eval("window.hatcheryRoom.select('solution.py')")
            b.eval(ARRIVALS)
        text = "def add(a, b):\n    pass\n"
        delays = []
        text = type_and_measure([cand], pages, text, 0, KEYS, delays)
        assert all(b.eval("window.hatcheryRoom.files()['solution.py']") == text for b in pages)

        # Read-only by default: an interviewer's editor does not take input.
        assert ints[0].eval("window.hatcheryRoom.view().state.facet(window.hatcheryRoom.view().constructor.editable)") is False
        # Pairing: the interviewer switches it on and types; everyone sees it.
        ints[0].click("#pairing")
        for b in ints:
            b.wait("window.hatcheryRoom.view().state.facet(window.hatcheryRoom.view().constructor.editable) === true",
                   what="pairing on")
        ints[0].wait(f"window.hatcheryRoom.view().state.doc.toString() === {json.dumps(text)}", what="interviewer view")
        text = type_and_measure([cand, ints[0], ints[1]], pages, text, KEYS, KEYS, delays)
        wait_file(cand, "solution.py", text, "the interviewers' edits on the candidate's page")
        delays.sort()
        print(f"\nroom keystroke delay, 3 clients ({len(delays)} arrivals of {len(delays) // 2} keystrokes): "
              f"p50 {pct(delays, 50):.1f} ms, p99 {pct(delays, 99):.1f} ms, max {delays[-1]:.1f} ms")

        # The candidate writes the answer and runs it: the run streams to
        # the interviewers.
        replace_all(cand, SOLUTION)
        for b in ints:
            wait_file(b, "solution.py", SOLUTION, "the answer on the interviewers' pages")
        cand.click("#run")
        cand.wait("document.getElementById('verdict').textContent === 'ok'", timeout=60, what="Run verdict")
        for b in ints:
            b.wait("document.getElementById('stdout').textContent === 'sum 5\\n'", timeout=30, what="Run output on an interviewer")
            b.wait("document.getElementById('verdict').textContent === 'ok'", timeout=30, what="verdict on an interviewer")

        # Notes: saved by an interviewer, never on the candidate's page or API.
        ints[1].eval(f"document.getElementById('notes').value = {json.dumps(NOTE)}")
        ints[1].click("#notes-save")
        ints[1].wait("document.getElementById('notes-saved').textContent.startsWith('saved')", what="notes saved")
        notes_path = f"/v1/rounds/{rid}/sessions/{sid}/notes"
        got = d.request("GET", notes_path, auth=False, headers={"Authorization": f"Bearer {it_token}"})
        assert got.status == 200 and got.json()["text"] == NOTE
        refused = d.request("GET", notes_path, auth=False, headers={"Authorization": f"Bearer {cand_token}"})
        assert refused.status == 403 and NOTE not in refused.body.decode()
        assert NOTE not in cand.eval("document.documentElement.outerHTML")
        assert cand.eval("document.getElementById('interviewer').hidden") is True

        # The candidate drops, types while away, and rejoins: nothing lost.
        cand.eval("window.hatcheryRoom.select('notes.md')")
        cand.eval("window.hatcheryRoom.drop()")
        insert_at_end(cand, "offline line\n")
        wait_file(ints[0], "notes.md", "scratch\noffline line\n", "an edit made while dropped", timeout=30)
        cand.goto(inv["url"])
        cand.wait("document.body.dataset.ready === 'true'", what="rejoined")
        want = {"solution.py": SOLUTION, "notes.md": "scratch\noffline line\n"}
        assert page_files(cand) == want
        for b in ints:
            assert page_files(b) == want

        # Submit grades exactly the server's document.
        cand.click("#submit")
        cand.wait("document.getElementById('result').dataset.passed === '1'", timeout=120, what="graded")
        rep = d.request("GET", f"/v1/rounds/{rid}/sessions/{sid}/report").json()
        sub_id = rep["submissions"][-1]["submission_id"]
        tl = d.request("GET", f"/v1/rounds/{rid}/sessions/{sid}/timeline").json()["entries"]
        kinds = [e["kind"] for e in tl]
        assert kinds[0] == "seed" and "run" in kinds and kinds[-1] == "submit", kinds
        sub_at = tl[-1]
        assert sub_at["ref_id"] == sub_id
        # What was graded, byte for byte, is the document at the Submit
        # (the capture is everything under /work: the room's files among it).
        sub = d.request("GET", f"/v1/rounds/{rid}/sessions/{sid}/submissions/{sub_id}").json()
        doc_at_submit = d.request("GET", f"/v1/rounds/{rid}/sessions/{sid}/document?at={sub_at['idx']}").json()
        assert doc_at_submit["files"] == want
        for p, t in doc_at_submit["files"].items():
            assert sub["files"][p] == t, p

        # Playback: the file at the Run is what ran.
        run_at = next(e for e in tl if e["kind"] == "run")
        at_run = d.request("GET", f"/v1/rounds/{rid}/sessions/{sid}/document?at={run_at['idx']}").json()
        assert at_run["files"]["solution.py"] == SOLUTION
        assert d.request("GET", f"/v1/rounds/{rid}/sessions/{sid}/document?at={run_at['idx']}", auth=False,
                         headers={"Authorization": f"Bearer {cand_token}"}).status == 403
        for b in pages:
            assert not b.exceptions(), b.exceptions()
    finally:
        for b in pages:
            b.close()
        d.request("POST", f"/v1/rounds/{rid}/sessions/{sid}/end")
