"""The widget in a real browser: headless Chromium (Debian package) driven
over the DevTools protocol against the demo page of a real gateway and
daemon. Saves a screenshot to target/test-artifacts/."""

import json
import os
import time

import pytest

from cdp import Browser
from pg_harness import REPO, assert_no_sandboxes

ARTIFACTS = os.environ.get("HATCHERY_TEST_ARTIFACTS", os.path.join(REPO, "target/test-artifacts"))


def q(section, what):
    return json.dumps(f"#{section} .hx-pg-{what}")


def state(b, section):
    return b.eval(f"""(() => {{
        const box = document.querySelector('#{section} .hx-pg');
        return {{state: box.getAttribute('data-state'),
                 out: box.querySelector('.hx-pg-out').textContent,
                 kind: box.querySelector('.hx-pg-msg').getAttribute('data-kind'),
                 msg: box.querySelector('.hx-pg-msg').textContent,
                 disabled: box.querySelector('.hx-pg-run').disabled}}; }})()""")


def wait_done(b, section, timeout=40):
    b.wait(f"document.querySelector('#{section} .hx-pg').getAttribute('data-state') !== 'running'",
           timeout=timeout, what=f"{section} finished")
    return state(b, section)


@pytest.fixture
def browser():
    b = Browser()
    yield b
    b.close()


def test_demo_page_in_chromium(gateway_factory, daemon, browser):
    # Every click comes from 127.0.0.1 and one browser session, so allow a
    # few more runs than a visitor gets, per IP and per session (seven runs
    # come before the exception case: with the default session burst of 6
    # that one only passed when the earlier runs had taken long enough for
    # a token to come back).
    g = gateway_factory("--ip-burst", "30", "--ip-per-minute", "30",
                        "--session-burst", "30", "--session-per-minute", "30", "--timeout", "5")
    b = browser
    # (1) The demo page turns its four samples into widgets.
    b.goto(f"http://127.0.0.1:{g.port}/playground/demo")
    b.wait("document.querySelectorAll('.hx-pg').length === 4", what="four widgets")
    assert b.eval("document.querySelectorAll('pre[data-hatchery-run]').length") == 0

    # (2) Hello world.
    b.click("#hello .hx-pg-run")
    s = wait_done(b, "hello")
    assert s["out"] == "Hello, world!\n", s
    assert s["kind"] == "ok" and not s["disabled"], s

    # (3) The slow loop: lines show up while the run is still going, and the
    # button stays disabled meanwhile.
    b.click("#slow .hx-pg-run")
    seen_partial = None
    deadline = time.time() + 30
    while time.time() < deadline:
        s = state(b, "slow")
        if s["state"] == "running" and "tick 1" in s["out"] and "done" not in s["out"]:
            seen_partial = s
        if s["state"] != "running":
            break
        time.sleep(0.05)
    assert seen_partial is not None, f"no output arrived before the run ended: {s}"
    assert seen_partial["disabled"] is True and seen_partial["kind"] == "running"
    assert s["out"] == "".join(f"tick {i}\n" for i in range(1, 6)) + "done\n", s
    assert s["kind"] == "ok"

    # (4) The fork bomb ends at the time limit with a clear message.
    t0 = time.time()
    b.click("#forkbomb .hx-pg-run")
    b.wait("document.querySelector('#forkbomb .hx-pg-run').disabled", timeout=5, what="button disabled")
    s = wait_done(b, "forkbomb")
    assert s["kind"] == "timeout" and "time limit" in s["msg"], s
    assert 4.5 < time.time() - t0 < 20
    assert not s["disabled"]

    # The print flood is cut off at the output cap.
    b.click("#flood .hx-pg-run")
    s = wait_done(b, "flood")
    assert s["kind"] == "truncated" and "cut off" in s["msg"], s
    assert s["out"].startswith("flood 0 ") and len(s["out"].encode()) == 32768

    # (5) The page is still usable: edit a sample and run the edited code.
    b.type_into("#hello .hx-pg-code", 'print("edited", 6 * 7)\n')
    b.click("#hello .hx-pg-run")
    s = wait_done(b, "hello")
    assert s["out"] == "edited 42\n" and s["kind"] == "ok", s
    # Running it again is answered from the cache, and says so.
    b.click("#hello .hx-pg-run")
    s = wait_done(b, "hello")
    assert s["out"] == "edited 42\n" and "cached" in s["msg"], s

    # (6) A Python exception: its traceback shows in the output, in the
    # stderr colour, after what was printed before it, and the status line
    # names the exception.
    b.type_into("#hello .hx-pg-code", 'print("before")\ndef f():\n    raise ValueError("boom")\nf()\n')
    b.click("#hello .hx-pg-run")
    s = wait_done(b, "hello")
    assert s["out"].startswith("before\nTraceback (most recent call last):\n"), s
    assert s["out"].endswith("ValueError: boom\n") and 'line 3, in f' in s["out"], s
    stderr = "[...document.querySelectorAll('#hello .hx-pg-stderr')].map(e => e.textContent).join('')"
    assert b.eval(stderr) == s["out"][len("before\n"):], b.eval(stderr)
    color = b.eval("getComputedStyle(document.querySelector('#hello .hx-pg-stderr')).color")
    assert color == "rgb(255, 123, 114)", color
    assert s["kind"] == "exit" and "raised ValueError" in s["msg"], s

    path = b.screenshot(os.path.join(ARTIFACTS, "playground-demo.png"))
    assert os.path.getsize(path) > 10_000
    assert b.exceptions() == [], b.exceptions()
    assert_no_sandboxes(daemon)


def test_refusal_is_shown_kindly(gateway_factory, daemon, browser):
    g = gateway_factory("--ip-burst", "1", "--ip-per-minute", "1")
    b = browser
    b.goto(f"http://127.0.0.1:{g.port}/playground/demo")
    b.wait("document.querySelectorAll('.hx-pg').length === 4", what="widgets")
    b.click("#hello .hx-pg-run")
    assert wait_done(b, "hello")["kind"] == "ok"
    b.type_into("#hello .hx-pg-code", "print('again')\n")
    b.click("#hello .hx-pg-run")
    s = wait_done(b, "hello")
    assert s["kind"] == "refused" and "faster than the playground allows" in s["msg"], s
    assert "Try again in" in s["msg"] and not s["disabled"]
    assert b.exceptions() == []
    assert_no_sandboxes(daemon)


def test_static_page_on_another_origin(gateway_factory, daemon, browser, tmp_path):
    """What docs/playground.md tells a docs author to do: a static page on
    its own origin, the widget from the gateway, the origin allowed."""
    import functools
    import http.server
    import threading

    from pg_harness import free_port

    docs_port = free_port()
    origin = f"http://127.0.0.1:{docs_port}"
    g = gateway_factory("--allow-origin", origin)
    gw = f"http://127.0.0.1:{g.port}"
    (tmp_path / "index.html").write_text(f"""<!doctype html>
<html><head><meta charset="utf-8"><title>My docs</title>
<link rel="stylesheet" href="{gw}/playground/widget.css">
<script src="{gw}/playground/widget.js" defer></script></head>
<body><h1>My library</h1>
<div id="ex"><pre data-hatchery-run data-template="code-interpreter">
import sys, time
print("from a static page", 2 ** 10, flush=True)
time.sleep(0.3)
print("on stderr", file=sys.stderr)
</pre></div></body></html>
""")
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *a):
            pass

    handler = functools.partial(Quiet, directory=str(tmp_path))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", docs_port), handler)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        b = browser
        b.goto(origin + "/index.html")
        b.wait("document.querySelectorAll('.hx-pg').length === 1", what="widget")
        b.click("#ex .hx-pg-run")
        s = wait_done(b, "ex")
        assert s["kind"] == "ok", s
        assert s["out"] == "from a static page 1024\non stderr\n", s
        stderr = "[...document.querySelectorAll('#ex .hx-pg-stderr')].map(e => e.textContent).join('')"
        assert b.eval(stderr) == "on stderr\n"
        assert b.exceptions() == []
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert_no_sandboxes(daemon)
