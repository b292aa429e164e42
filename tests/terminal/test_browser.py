"""The browser terminal (/terminal/, xterm.js bundled in web/terminal/dist)
in headless Chromium against a real daemon: typing reaches the sandbox's
terminal and its output the xterm.js buffer, the window size follows the
page, a full-screen program (top: the template has no vi or less) runs,
redraws on resize and quits, and everything is served by the daemon."""

import json
import os
import time

from harness import KEY

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
ARTIFACTS = os.environ.get("HATCHERY_TEST_ARTIFACTS", os.path.join(REPO, "target/test-artifacts"))

SCREEN = """(() => { const t = window.hatcheryTerminal.term, b = t.buffer.active, out = [];
    for (let i = 0; i < b.length; i++) out.push(b.getLine(i).translateToString(true));
    return out.join('\\n'); })()"""
VIEWPORT = """(() => { const t = window.hatcheryTerminal.term, b = t.buffer.active, out = [];
    for (let i = b.viewportY; i < b.viewportY + t.rows; i++) out.push(b.getLine(i).translateToString(true, 0, t.cols));
    return out.join('\\n'); })()"""


def token(daemon, sid):
    r = daemon.request("POST", f"/v1/sandboxes/{sid}/pty/token")
    assert r.status == 200, r
    return r.json()["token"]


def open_terminal(b, daemon, sid, extra=""):
    b.goto(f"http://127.0.0.1:{daemon.port}/terminal/#sandbox={sid}&token={token(daemon, sid)}{extra}")
    b.wait("document.getElementById('terminal').getAttribute('data-state') === 'open'", what="terminal open")
    b.wait(f"{SCREEN}.includes('root@sandbox:')", what="prompt")


def screen(b):
    return b.eval(SCREEN)


def type_line(b, text):
    """Types into xterm.js as a user would: text input, then the Enter key."""
    b.eval("document.querySelector('#terminal .xterm-helper-textarea').focus()")
    if text:
        b.call("Input.insertText", {"text": text})
    for t in ("keyDown", "keyUp"):
        b.call("Input.dispatchKeyEvent", {"type": t, "key": "Enter", "code": "Enter",
                                          "windowsVirtualKeyCode": 13, **({"text": "\r"} if t == "keyDown" else {})})


def press(b, text):
    b.eval("document.querySelector('#terminal .xterm-helper-textarea').focus()")
    b.call("Input.insertText", {"text": text})


def size(b):
    return b.eval("[window.hatcheryTerminal.term.rows, window.hatcheryTerminal.term.cols]")


def stable_size(b, settle=0.5, timeout=10):
    """The terminal's size once it has stopped changing (a resize can refit
    in more than one step)."""
    last, since, deadline = size(b), time.time(), time.time() + timeout
    while time.time() < deadline:
        time.sleep(0.1)
        now = size(b)
        if now != last:
            last, since = now, time.time()
        elif time.time() - since >= settle:
            return last
    return last


def resize_window(b, width, height):
    b.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})


def test_echo_resize_top_in_chromium(daemon, browser):
    b = browser
    sid = daemon.create(ttl_seconds=300)
    open_terminal(b, daemon, sid)
    # The page connected with its fitted size, not the 80x24 default.
    rows, cols = stable_size(b)
    assert (rows, cols) != (24, 80) and rows > 10 and cols > 40, (rows, cols)

    # (1) echo hi, and hi shows up in the terminal's buffer.
    type_line(b, "echo hi; stty size")
    b.wait(f"{SCREEN}.split('\\n').includes('hi')", what="hi in the buffer")
    b.wait(f"{SCREEN}.includes('{rows} {cols}')", what="stty size = the fitted size")

    # (2) top, then a narrower window: the terminal refits, the resize
    # reaches the sandbox (SIGWINCH), and top redraws for the new width:
    # its first line is cut at the edge, so the second row is its second
    # line ("Tasks: ..."), not the wrapped rest of a line drawn too wide.
    type_line(b, "top -d 1")
    b.wait(f"{VIEWPORT}.includes('load average')", what="top running")
    first = f"{VIEWPORT}.split('\\n')"
    assert b.eval(f"{first}[0].length") > 60  # wide enough for the whole first line
    resize_window(b, 460, 420)
    b.wait(f"window.hatcheryTerminal.term.cols < 55 && window.hatcheryTerminal.term.rows < {rows}",
           what="terminal refit to the smaller window")
    new_rows, new_cols = stable_size(b)
    b.wait(f"{first}[0].startsWith('top - ') && {first}[1].startsWith('Tasks:')", timeout=10,
           what="top redrawn at the new width")
    assert len(b.eval(VIEWPORT).split("\n")) == new_rows
    # (3) q leaves top (the full-screen program), back at the prompt with
    # the new size.
    # q quits top: the prompt is back at the bottom of the screen (top's
    # first line, cut at this width, no longer says "load average" whole,
    # so that is no test).
    press(b, "q")
    b.wait(f"{first}.filter(l => l.trim()).pop().startsWith('root@sandbox:')", what="top gone, the prompt back")
    # (The fit may have moved a column or two since, as xterm.js's scrollbar
    # came or went: each refit is a resize too, so compare with the latest.)
    new_rows, new_cols = stable_size(b)
    type_line(b, "stty size")
    try:
        b.wait(f"{SCREEN}.includes('{new_rows} {new_cols}')", what="stty size after the resize")
    except AssertionError:
        raise AssertionError(f"size {size(b)}, screen: {screen(b)[-1500:]!r}")

    # (4) Ctrl-C (a real key event) interrupts a foreground sleep.
    type_line(b, "sleep 100")
    time.sleep(0.5)
    b.eval("document.querySelector('#terminal .xterm-helper-textarea').focus()")
    for t in ("keyDown", "keyUp"):
        b.call("Input.dispatchKeyEvent", {"type": t, "key": "c", "code": "KeyC", "windowsVirtualKeyCode": 67,
                                          "modifiers": 2})
    type_line(b, "echo rc=$?")
    b.wait(f"{SCREEN}.includes('rc=130')", what="sleep interrupted")

    path = b.screenshot(os.path.join(ARTIFACTS, "terminal.png"))
    assert os.path.getsize(path) > 5_000
    # Everything came from the daemon itself: no CDN.
    origin = f"http://127.0.0.1:{daemon.port}"
    resources = b.eval("performance.getEntriesByType('resource').map(e => e.name)")
    assert resources and all(r.startswith(origin) for r in resources), resources
    assert b.exceptions() == [], b.exceptions()

    # (5) exit: the page says so, and the terminal is gone.
    type_line(b, "exit 4")
    b.wait("document.getElementById('terminal').getAttribute('data-state') === 'exited'", what="exited")
    assert "exited with status 4" in b.eval("document.getElementById('status').textContent")
    r = daemon.exec(sid, "ps -eo args --no-headers | grep -c '^/bin/bash -l' || true")
    assert r["stdout"].strip() == "0", r


def test_leaving_the_page_ends_the_terminal(daemon, browser):
    # Also when the browser keeps the page in its back/forward cache: the
    # page closes the socket on pagehide.
    b = browser
    sid = daemon.create(ttl_seconds=300)
    open_terminal(b, daemon, sid)
    type_line(b, "setsid sleep 339 & echo st''arted")
    b.wait(f"{SCREEN}.includes('started')", what="started")
    b.goto("about:blank")
    deadline = time.time() + 10
    while True:
        r = daemon.exec(sid, "ps -eo args --no-headers | grep -cE '^sleep 339|^/bin/bash -l' || true")
        if r["stdout"].strip() == "0":
            break
        assert time.time() < deadline, r
        time.sleep(0.2)


def test_the_page_without_or_with_a_spent_token(daemon, browser):
    b = browser
    sid = daemon.create(ttl_seconds=300)
    b.goto(f"http://127.0.0.1:{daemon.port}/terminal/")
    assert "pty/token" in b.eval("document.getElementById('status').textContent")
    b.goto("about:blank")  # (a fragment change alone would not reload the page)
    tok = token(daemon, sid)
    url = f"http://127.0.0.1:{daemon.port}/terminal/#sandbox={sid}&token={tok}"
    b.goto(url)
    b.wait("document.getElementById('terminal').getAttribute('data-state') === 'open'", what="open")
    # The token left the address bar at once.
    assert tok not in b.eval("location.href")
    # A spent token: the upgrade is refused (401) and the page says closed.
    b.goto("about:blank")
    b.goto(url)
    b.wait("document.getElementById('terminal').getAttribute('data-state') === 'closed'", what="closed")
    assert b.eval("document.getElementById('status').textContent").startswith("closed")
    # The page's own files, with their headers.
    r = daemon.request("GET", "/terminal/terminal.js", auth=False)
    assert r.status == 200 and r.headers["content-type"].startswith("text/javascript")
    assert "default-src 'none'" in r.headers["content-security-policy"]
    assert daemon.request("GET", "/terminal/nope.js", auth=False).status == 404
    assert daemon.request("GET", "/terminal", auth=False).status == 308


HOG = "python3 -c 'x = []; [x.append(bytearray(50 << 20)) for _ in iter(int, 1)]'"


def test_a_memory_kill_is_told_in_the_terminal(daemon, browser):
    """Issue 34: a shell's child killed for memory ends with status 1 and
    the shell prints nothing about it (the guest cannot tell); the daemon
    sends an `oom` message and the page writes it into the terminal. The
    sandbox stays, and a program that itself is killed for memory ends the
    terminal with reason oom."""
    sid = daemon.create()
    open_terminal(browser, daemon, sid)
    type_line(browser, HOG)
    browser.wait(f"{SCREEN}.includes('killed: out of memory (')", timeout=90, what="the oom notice")
    type_line(browser, "echo still-$((40+2))")
    browser.wait(f"{SCREEN}.includes('still-42')", timeout=30, what="the shell goes on")
    type_line(browser, f"exec {HOG}")
    browser.wait("document.getElementById('terminal').getAttribute('data-state') === 'exited'",
                 timeout=90, what="the terminal ends")
    status = browser.eval("document.getElementById('status').textContent")
    assert "out of memory" in status, status
    assert daemon.exec(sid, "echo alive")["stdout"] == "alive\n"
