"""The interview pages in headless Chromium against a real daemon: the
candidate room (CodeMirror 6 with syntax highlighting, file tabs, Run with
streamed output and the verdict, Submit with counts only, the terminal)
and the reviewer page (runs, the full report, a replay, a fork and its
file viewer). Screenshots go to target/test-artifacts/rounds-*.png."""

import json
import os

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
ARTIFACTS = os.environ.get("HATCHERY_TEST_ARTIFACTS", os.path.join(REPO, "target/test-artifacts"))
ASSERT_TEXT = "expected-product-" + "12"

TESTS = {"test_hidden.py": f"""from solution import add, mul

def test_add():
    assert add(2, 3) == 5

def test_mul():
    assert mul(3, 4) == 12, "{ASSERT_TEXT}"
"""}

SOLUTION = "def add(a, b):\n    return a + b\n\ndef mul(a, b):\n    return a * b + 1\n\nprint('sum', add(2, 3))\n"


def shot(b, name):
    os.makedirs(ARTIFACTS, exist_ok=True)
    b.screenshot(os.path.join(ARTIFACTS, f"rounds-{name}.png"))


def test_room_and_review_pages(daemon, browser):
    d, b = daemon, browser
    r = d.request("POST", "/v1/rounds", {
        "name": "Pairing: add and mul",
        "starter_files": {"solution.py": "def add(a, b):\n    pass\n", "helpers.py": "# helpers\n"},
        "tests": {"files": TESTS}, "cpu_time_limit_ms": 2000})
    assert r.status == 201, r
    rid = r.json()["id"]
    inv = d.request("POST", f"/v1/rounds/{rid}/sessions", {"candidate": "grace@example.com"}).json()
    url = inv["url"]
    assert url.startswith(f"http://127.0.0.1:{d.port}/rounds/room/?")

    # The page is static and served without the key; it holds no secret.
    page = d.request("GET", "/rounds/room/", auth=False)
    assert page.status == 200 and "default-src 'none'" in page.headers.get("content-security-policy", "")
    assert d.request("GET", "/rounds/assets/nope.js", auth=False).status == 404

    b.goto(url)
    b.wait("document.body.dataset.ready === 'true'", what="room ready")
    b.wait("document.querySelectorAll('#tabs button').length === 2", what="file tabs")
    tabs = b.eval("[...document.querySelectorAll('#tabs button')].map(x => x.textContent)")
    assert tabs == ["solution.py", "helpers.py"], tabs
    assert b.eval("document.getElementById('state').textContent") == "live"
    # Syntax highlighting: the `def` keyword is its own styled span.
    b.wait("[...document.querySelectorAll('.cm-content span')].some(s => s.textContent === 'def' && getComputedStyle(s).color !== getComputedStyle(document.querySelector('.cm-content')).color)",
           what="highlighted keyword")
    b.eval(f"""(() => {{ const v = window.hatcheryRoom.view();
        v.dispatch({{changes: {{from: 0, to: v.state.doc.length, insert: {json.dumps(SOLUTION)}}}}}); }})()""")
    b.click("#run")
    b.wait("document.getElementById('verdict').textContent === 'ok'", timeout=60, what="Run verdict")
    assert b.eval("document.getElementById('stdout').textContent") == "sum 5\n"
    assert "cpu" in b.eval("document.getElementById('stats').textContent")
    shot(b, "room-run")

    # Switching tabs keeps each file's edits.
    b.click("#tabs button[data-path='helpers.py']")
    b.wait("window.hatcheryRoom.view().state.doc.toString() === '# helpers\\n'", what="helpers tab")
    b.click("#tabs button[data-path='solution.py']")
    b.wait(f"window.hatcheryRoom.view().state.doc.toString() === {json.dumps(SOLUTION)}", what="solution kept")

    b.click("#submit")
    b.wait("document.getElementById('result').dataset.passed === '1'", timeout=120, what="graded")
    text = b.eval("document.body.innerText")
    assert "1 / 2 passed" in text and "test_mul" in text
    assert ASSERT_TEXT not in text and "AssertionError" not in text
    shot(b, "room-graded")

    b.click("#terminal-open")
    b.wait("document.getElementById('terminal').getAttribute('data-state') === 'open'", timeout=30, what="terminal")
    shot(b, "room-terminal")
    assert not b.exceptions(), b.exceptions()

    # The reviewer page.
    rv = d.request("POST", f"/v1/rounds/{rid}/reviewer-tokens", {}).json()
    b.goto(rv["url"])
    b.wait("document.body.dataset.ready === 'true' && document.querySelectorAll('#sessions li').length === 1", what="review ready")
    b.click("#sessions li")
    b.wait(f"document.body.dataset.loaded === {json.dumps(inv['id'])}", what="session loaded")
    b.wait("document.querySelectorAll('#runs tbody tr').length === 1", what="runs")
    assert b.eval("document.querySelector('#runs tbody tr').dataset.verdict") == "ok"
    b.wait(f"document.getElementById('report').innerText.includes({json.dumps(ASSERT_TEXT)})", what="full report")
    b.click("#take-replay")
    b.wait("document.querySelectorAll('#replays li').length === 1", timeout=60, what="replay")
    b.click("#replays li button")
    b.wait("document.querySelectorAll('#fork-files li').length >= 2", timeout=60, what="fork files")
    b.click("#fork-files li[data-path='solution.py']")
    b.wait(f"document.getElementById('fork-content').textContent === {json.dumps(SOLUTION)}", what="file viewer")
    shot(b, "review")
    fork_id = b.eval("document.body.dataset.fork")
    sbx = [s for s in d.request("GET", "/v1/sandboxes").json()["sandboxes"]
           if s["metadata"].get("hatchery.kind") == "round-review-fork"]
    assert len(sbx) == 1
    assert d.request("GET", f"/v1/sandboxes/{sbx[0]['id']}/network").json()["egress"] == "deny"
    b.click("#fork-delete")
    b.wait("document.getElementById('fork').hidden", what="fork deleted")
    assert fork_id
    assert not b.exceptions(), b.exceptions()
    assert d.request("POST", f"/v1/rounds/{rid}/sessions/{inv['id']}/end").status == 200
