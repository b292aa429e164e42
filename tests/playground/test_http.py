"""HTTP tests of hatchery-playground against a real daemon: every refusal
and its order, cache hit and miss, byte cap, time limit, client disconnect,
the TTL backstop, the runs table and stats. Each test ends with no sandbox
left on the daemon (conftest)."""

import json
import os
import signal
import sqlite3
import threading
import time
import uuid

from pg_harness import assert_no_sandboxes, metric, sandboxes, wait_for

TRUST = ("--trusted-proxy", "127.0.0.1")


def uniq(tag="x"):
    return f"print('{tag}', '{uuid.uuid4().hex}')\n"


def ip():
    b = uuid.uuid4().bytes
    return f"198.51.{b[0]}.{b[1]}"


def assert_error(res, status, code):
    assert res.status == status, res
    body = res.json()
    assert body["error"]["code"] == code, body
    assert body["error"]["message"], body


# --- refusals ---------------------------------------------------------------

def test_too_large_is_first_and_spends_nothing(gateway_factory, daemon):
    g = gateway_factory(*TRUST, "--max-code-bytes", "100", "--ip-per-minute", "1", "--ip-burst", "1",
                        "--max-in-flight", "1")
    created = metric(daemon, "hatchery_sandboxes_created_total")
    a = ip()
    # Oversize with an unknown template, repeatedly: 413 every time, and no
    # rate token is taken (the same IP can still run afterwards).
    for _ in range(3):
        assert_error(g.run("x" * 101, template="nope", ip=a), 413, "too_large")
    # A body too big to be any acceptable snippet is refused while reading.
    assert_error(g.run(None, raw=b'{"code":"' + b"y" * 200_000 + b'"}', ip=a), 413, "too_large")
    assert_error(g.run(None, raw=b"not json", ip=a), 400, "invalid_json")
    r = g.run("print('ok')", ip=a)
    assert r.status == 200 and r.stdout() == "ok\n", r
    # Now the bucket is empty: oversize is still 413, not 429.
    assert_error(g.run("x" * 101, ip=a), 413, "too_large")
    assert metric(daemon, "hatchery_sandboxes_created_total") == created + 1
    assert g.metric('hatchery_playground_refusals_total{reason="too_large"}') == 5


def test_rate_limit_per_ip_with_retry_after(gateway_factory):
    g = gateway_factory(*TRUST, "--ip-per-minute", "6", "--ip-burst", "2")
    a, b = ip(), ip()
    code = "print(1)"
    assert g.run(code, ip=a).status == 200
    assert g.run(code, ip=a).status == 200
    r = g.run(code, ip=a)
    assert_error(r, 429, "rate_limited")
    retry = int(r.headers["Retry-After"])
    assert 1 <= retry <= 10, retry
    # Another IP is unaffected.
    assert g.run(code, ip=b).status == 200
    assert g.metric('hatchery_playground_refusals_total{reason="rate_limited"}') == 1


def test_rate_limit_per_session_cookie(gateway_factory):
    g = gateway_factory(*TRUST, "--ip-burst", "100", "--ip-per-minute", "100", "--session-burst", "2",
                        "--session-per-minute", "1")
    conn, r = g.open_run("print(1)", ip=ip())
    cookie = r.getheader("Set-Cookie").split(";")[0]
    assert cookie.startswith("hx_playground=") and len(cookie) == len("hx_playground=") + 32, cookie
    r.read()
    conn.close()
    # One token left on this session, from any IP; then 429 even from fresh IPs.
    assert g.run("print(2)", ip=ip(), cookie=cookie).status == 200
    assert_error(g.run("print(3)", ip=ip(), cookie=cookie), 429, "rate_limited")
    # Without the cookie the IP bucket alone decides.
    assert g.run("print(3)", ip=ip()).status == 200


def test_forwarded_for_ignored_from_untrusted_peer(gateway_factory):
    g = gateway_factory("--ip-burst", "1", "--ip-per-minute", "1")  # no trusted proxy
    assert g.run("print(1)", ip=ip()).status == 200
    # A new X-Forwarded-For does not buy a new bucket: the peer is 127.0.0.1.
    assert_error(g.run("print(1)", ip=ip()), 429, "rate_limited")


def test_refusal_order_rate_then_busy_then_template(gateway_factory, daemon):
    g = gateway_factory(*TRUST, "--max-in-flight", "1", "--ip-burst", "1", "--ip-per-minute", "1")
    spent, holder = ip(), ip()
    assert g.run("print(1)", ip=spent).status == 200  # empties `spent`'s bucket
    # Hold the only in-flight slot with a run that waits.
    conn, r = g.open_run("import time\nprint('holding', flush=True)\ntime.sleep(30)\n", ip=holder)
    assert r.status == 200
    r.readline()
    try:
        wait_for(lambda: len(sandboxes(daemon)) == 1, timeout=10, what="holder sandbox")
        # Empty bucket + busy + unknown template: rate limit is checked first.
        res = g.run("print(2)", template="nope", ip=spent)
        assert_error(res, 429, "rate_limited")
        assert "Retry-After" in res.headers
        # Fresh IP, busy, unknown template: busy is checked before the template.
        res = g.run("print(2)", template="nope", ip=ip())
        assert_error(res, 503, "busy")
        assert int(res.headers["Retry-After"]) >= 1
        # Fresh IP, busy, known template, not cached: 503.
        assert_error(g.run(uniq(), ip=ip()), 503, "busy")
        # A cached snippet spends nothing, so it is served even while busy.
        hit = g.run("print(1)", ip=ip())
        assert hit.status == 200 and hit.exit()["cached"] is True and hit.stdout() == "1\n"
    finally:
        conn.close()
    # Disconnecting the holder frees the slot (its sandbox is deleted).
    assert_no_sandboxes(daemon)
    wait_for(lambda: g.metric("hatchery_playground_in_flight") == 0, timeout=10, what="slot freed")
    res = g.run("print(2)", template="n" * 5000, ip=ip())
    assert_error(res, 400, "unknown_template")
    assert len(res.body) < 300, "visitor input is not echoed at length"
    reasons = {r: g.metric(f'hatchery_playground_refusals_total{{reason="{r}"}}')
               for r in ("rate_limited", "busy", "unknown_template")}
    assert reasons == {"rate_limited": 1, "busy": 2, "unknown_template": 1}, reasons
    assert max(len(t or "") for (t,) in query(g, "SELECT template FROM runs")) <= 64


# --- cache --------------------------------------------------------------------

def test_cache_miss_then_hit_without_sandbox(gateway_factory, daemon):
    g = gateway_factory(*TRUST)
    code = uniq("cache") + "import sys\nprint('to stderr', file=sys.stderr)\n"
    created = metric(daemon, "hatchery_sandboxes_created_total")
    first = g.run(code, ip=ip())
    assert first.status == 200, first
    assert first.named("start")[0]["cached"] is False
    assert first.exit()["cached"] is False and first.exit()["exit_code"] == 0
    assert metric(daemon, "hatchery_sandboxes_created_total") == created + 1
    second = g.run(code, ip=ip())
    assert second.status == 200
    assert second.named("start")[0]["cached"] is True
    # Same events in the same shape, with the marker.
    strip = [(e, d) for e, d in first.events if e in ("stdout", "stderr")]
    assert [(e, d) for e, d in second.events if e in ("stdout", "stderr")] == strip
    assert second.stderr() == "to stderr\n"
    ex1, ex2 = dict(first.exit()), dict(second.exit())
    assert ex2.pop("cached") is True and ex1.pop("cached") is False
    assert ex1 == ex2
    assert metric(daemon, "hatchery_sandboxes_created_total") == created + 1, "a hit never touches a sandbox"
    # A one-character edit is a miss.
    third = g.run(code + "\n", ip=ip())
    assert third.exit()["cached"] is False
    assert metric(daemon, "hatchery_sandboxes_created_total") == created + 2
    assert g.metric("hatchery_playground_cache_hits_total") == 1
    assert g.metric("hatchery_playground_cache_misses_total") == 2
    assert abs(g.metric("hatchery_playground_cache_hit_ratio") - 1 / 3) < 1e-6


def test_cache_is_bounded(gateway_factory):
    g = gateway_factory(*TRUST, "--cache-entries", "2", "--ip-burst", "50")
    codes = [uniq(str(i)) for i in range(3)]
    for c in codes:
        assert g.run(c, ip=ip()).exit()["cached"] is False
    assert g.metric("hatchery_playground_cache_entries") == 2
    # The oldest was evicted; the newest is still there.
    assert g.run(codes[2], ip=ip()).exit()["cached"] is True
    assert g.run(codes[0], ip=ip()).exit()["cached"] is False


# --- output, time, disconnect --------------------------------------------------

def test_output_streams_as_produced(gateway_factory):
    g = gateway_factory(*TRUST)
    r = g.run(f"# {uuid.uuid4().hex}\nimport time\nfor i in range(4):\n    print('line', i)\n    time.sleep(0.5)\n",
              ip=ip())
    assert r.stdout() == "".join(f"line {i}\n" for i in range(4))
    outs = [t for (e, _), t in zip(r.events, r.times) if e == "stdout"]
    ends = r.times[-1]
    # The first line arrived well before the run ended.
    assert ends - outs[0] > 1.0, (outs, ends)


def test_byte_cap_stops_flood_and_memory_stays_flat(gateway_factory):
    cap = 4096
    g = gateway_factory(*TRUST, "--max-output-bytes", str(cap), "--ip-burst", "50", "--timeout", "10")
    flood = "i = 0\nwhile True:\n    print('flood', i, '=' * 60)\n    i += 1\n"
    rss = []
    for i in range(6):
        r = g.run(flood + f"# {i}\n", ip=ip())
        ex = r.exit()
        assert ex["truncated"] is True and ex["timed_out"] is False, ex
        assert len(r.stdout().encode()) == cap
        assert ex["duration_ms"] < 8000, "stopped at the cap, not at the time limit"
        rss.append(g.rss_kb())
    # Stderr has its own cap.
    r = g.run("import sys\nwhile True:\n    sys.stderr.write('e' * 1000 + '\\n')\n", ip=ip())
    assert r.exit()["truncated"] is True and len(r.stderr().encode()) == cap
    assert rss[-1] - rss[1] < 8 * 1024, f"gateway RSS grew: {rss}"


def test_wall_clock_cap(gateway_factory, daemon):
    g = gateway_factory(*TRUST, "--timeout", "2")
    t0 = time.monotonic()
    r = g.run(f"# {uuid.uuid4().hex}\nprint('spinning', flush=True)\nwhile True:\n    pass\n", ip=ip())
    took = time.monotonic() - t0
    ex = r.exit()
    assert ex["timed_out"] is True and ex["exit_code"] is None, ex
    assert r.stdout() == "spinning\n"
    assert 2.0 <= took < 5.0, took
    # The sandbox is gone by the time the visitor sees `exit`.
    assert sandboxes(daemon) == []


def test_client_disconnect_kills_sandbox(gateway_factory, daemon):
    g = gateway_factory(*TRUST, "--timeout", "30")
    for code in ("import time\nprint('started', flush=True)\ntime.sleep(60)\n",
                 "import time\ntime.sleep(60)\n"):
        conn, r = g.open_run(code + f"# {uuid.uuid4().hex}\n", ip=ip())
        assert r.status == 200
        if "started" in code:
            read_sse_until_stdout(r)
        wait_for(lambda: len(sandboxes(daemon)) == 1, timeout=10, what="sandbox up")
        t0 = time.monotonic()
        conn.sock.shutdown(2)
        conn.close()
        assert_no_sandboxes(daemon, timeout=5)
        assert time.monotonic() - t0 < 5
    wait_for(lambda: g.metric("hatchery_playground_in_flight") == 0, timeout=5, what="slots freed")
    # The run log is written behind the run (the slot is freed first).
    q = "SELECT outcome FROM runs WHERE cached = 0 AND refused IS NULL"
    wait_for(lambda: len(query(g, q)) == 2, timeout=5, what="both runs in the run log")
    rows = query(g, q)
    assert sorted(r[0] for r in rows) == ["disconnected", "disconnected"], rows


def read_sse_until_stdout(r):
    while True:
        line = r.readline()
        assert line, "stream ended"
        if line.startswith(b"event: stdout"):
            return


def test_ttl_backstop_when_gateway_dies(gateway_factory, daemon):
    g = gateway_factory(*TRUST, "--timeout", "1", "--ttl", "1")
    conn, r = g.open_run("import time\nprint('x', flush=True)\ntime.sleep(60)\n", ip=ip())
    read_sse_until_stdout(r)
    (sbx,) = sandboxes(daemon)
    assert sbx["metadata"].get("created_by") == "hatchery-playground"
    g.stop(signal.SIGKILL)
    conn.close()
    # TTL = time limit + 10 s (the floor); the daemon reaps it on its own.
    assert_no_sandboxes(daemon, timeout=25)


# --- run_code, no shell, files, templates --------------------------------------

def test_python_runs_through_run_code(gateway_factory, daemon):
    """An uncached Python snippet goes to the sandbox's running interpreter
    (the daemon's code/stream), not to a file and python3."""
    g = gateway_factory(*TRUST)
    runs, execs = metric(daemon, "hatchery_code_runs_total"), metric(daemon, "hatchery_execs_total")
    created = metric(daemon, "hatchery_sandboxes_created_total")
    code = f"# {uuid.uuid4().hex}\nprint('Hello, world!')\n"
    r = g.run(code, ip=ip())
    assert r.stdout() == "Hello, world!\n" and r.stderr() == "", r
    ex = r.exit()
    assert ex["exit_code"] == 0 and ex["exception"] is None and ex["cached"] is False, ex
    assert metric(daemon, "hatchery_code_runs_total") == runs + 1
    assert metric(daemon, "hatchery_execs_total") == execs, "no exec, no file"
    assert metric(daemon, "hatchery_sandboxes_created_total") == created + 1, "a fresh sandbox"
    # Its cache hit spends neither.
    hit = g.run(code, ip=ip())
    assert hit.exit()["cached"] is True and hit.stdout() == "Hello, world!\n"
    assert metric(daemon, "hatchery_code_runs_total") == runs + 1


def test_exception_traceback_on_stderr_and_results_on_stdout(gateway_factory, daemon):
    g = gateway_factory(*TRUST)
    code = f"# {uuid.uuid4().hex}\nprint('before')\ndef f():\n    return 1 / 0\nf()\nprint('never')\n"
    r = g.run(code, ip=ip())
    assert r.stdout() == "before\n", r
    assert r.stderr().startswith("Traceback (most recent call last):\n"), r.stderr()
    assert "in f\n" in r.stderr() and r.stderr().endswith("ZeroDivisionError: division by zero\n"), r.stderr()
    ex = r.exit()
    assert ex["exit_code"] == 1 and not ex["timed_out"] and not ex["truncated"], ex
    assert ex["exception"] == {"name": "ZeroDivisionError", "value": "division by zero"}, ex
    # The cache replays the traceback and the exception alike.
    hit = g.run(code, ip=ip())
    assert hit.stderr() == r.stderr() and hit.exit()["exception"] == ex["exception"], hit
    # A last expression's value and display() show as stdout, as in a notebook.
    r = g.run(f"# {uuid.uuid4().hex}\ndisplay({{'a': 1}})\nprint('x')\n6 * 7\n", ip=ip())
    assert r.stdout() == "{'a': 1}\nx\n42\n", r
    assert r.exit()["exit_code"] == 0 and r.exit()["exception"] is None
    # A syntax error is an exception with exit status 1, too.
    r = g.run(f"# {uuid.uuid4().hex}\ndef (:\n", ip=ip())
    assert r.exit()["exit_code"] == 1 and r.exit()["exception"]["name"] == "SyntaxError", r
    assert "SyntaxError" in r.stderr()


def test_snippet_is_never_a_shell_string(gateway_factory):
    g = gateway_factory(*TRUST, "--template", "code-interpreter=python,sh-demo=sh")
    nasty = "'; echo INJECTED; ' $(echo INJECTED) `echo INJECTED` \" \\"
    r = g.run(f"print({json.dumps(nasty)})\nimport os\nprint(os.getcwd())\n", ip=ip())
    assert r.stdout() == nasty + "\n/workspace\n", r.stdout()
    # The shell runner is only known to the gateway; the daemon has no such
    # template, so the run fails kindly rather than running anything else.
    r = g.run("echo hi", template="sh-demo", ip=ip())
    assert r.status == 200 and r.named("error")[0]["error"]["code"] == "unavailable", r


def test_python_exec_runner_writes_a_file(gateway_factory, daemon):
    """`NAME=python-exec` keeps the file-and-exec path: the snippet becomes
    /workspace/main.py, run with python3 -u as an argv."""
    g = gateway_factory(*TRUST, "--template", "code-interpreter=python-exec")
    runs, execs = metric(daemon, "hatchery_code_runs_total"), metric(daemon, "hatchery_execs_total")
    nasty = "'; echo INJECTED; ' $(echo INJECTED) `echo INJECTED` \" \\"
    r = g.run(f"print({json.dumps(nasty)})\nimport sys\nprint(sys.argv[0])\n1 / 0\n", ip=ip())
    assert r.stdout() == nasty + "\n/workspace/main.py\n", r.stdout()
    assert 'File "/workspace/main.py", line 4' in r.stderr(), r.stderr()
    assert r.exit()["exit_code"] == 1 and r.exit()["exception"] is None, r.exit()
    assert metric(daemon, "hatchery_execs_total") == execs + 1
    assert metric(daemon, "hatchery_code_runs_total") == runs


def test_exit_status_and_stderr(gateway_factory):
    g = gateway_factory(*TRUST)
    r = g.run(f"# {uuid.uuid4().hex}\nimport sys\nprint('bad', file=sys.stderr)\nsys.exit(3)\n", ip=ip())
    ex = r.exit()
    assert ex["exit_code"] == 3 and not ex["timed_out"] and not ex["truncated"]
    assert r.stderr() == "bad\n"


def test_concurrent_runs_get_distinct_sandboxes(gateway_factory, daemon):
    g = gateway_factory(*TRUST)
    results = [None] * 4
    code = "import socket, time\nprint(socket.gethostname(), open('/proc/sys/kernel/random/boot_id').read().strip())\n"

    def one(i):
        results[i] = g.run(code + f"# {uuid.uuid4().hex}\nimport os\nopen('/workspace/mark', 'a').write('x')\n"
                           "print(len(open('/workspace/mark').read()))\n", ip=ip())

    ts = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    for r in results:
        assert r.exit()["exit_code"] == 0, r
        # Each run saw only its own marker: never a reused sandbox.
        assert r.stdout().splitlines()[-1] == "1"


# --- runs table, stats, metrics, assets ----------------------------------------

def query(g, sql):
    c = sqlite3.connect(g.db)
    try:
        return c.execute(sql).fetchall()
    finally:
        c.close()


def test_runs_table_stats_and_metrics(gateway_factory):
    g = gateway_factory(*TRUST, "--ip-burst", "3", "--ip-per-minute", "1")
    visitor = "203.0.113.77"
    code = uniq("stats")
    assert g.run(code, ip=visitor).exit()["cached"] is False
    assert g.run(code, ip=visitor).exit()["cached"] is True
    assert_error(g.run("x", template="nope", ip=visitor), 400, "unknown_template")
    assert_error(g.run("x", ip=visitor), 429, "rate_limited")
    wait_for(lambda: len(query(g, "SELECT * FROM runs")) == 4, timeout=5, what="rows written")
    cols = [r[1] for r in query(g, "PRAGMA table_info(runs)")]
    for c in ("run_id", "time", "ip_hash", "template", "duration_ms", "exit_code", "bytes_out", "cached", "refused"):
        assert c in cols, cols
    rows = query(g, "SELECT * FROM runs")
    assert visitor not in repr(rows), "raw IP stored"
    assert len({r[cols.index("ip_hash")] for r in rows}) == 1
    refused = sorted(r[0] for r in query(g, "SELECT refused FROM runs WHERE refused IS NOT NULL"))
    assert refused == ["rate_limited", "unknown_template"]
    ran = query(g, "SELECT exit_code, bytes_out, cached FROM runs WHERE refused IS NULL ORDER BY cached")
    assert ran == [(0, len(code) - len("print(, )") - 4 + 1, 0), (0, ran[0][1], 1)], ran
    s = g.get("/playground/stats").json()
    assert (s["requests"], s["ran"], s["cached"]) == (4, 1, 1), s
    assert s["refused"] == {"rate_limited": 1, "unknown_template": 1}
    assert s["unique_clients"] == 1 and s["cache_hit_ratio"] == 0.5
    assert s["duration_ms_p50"] > 0 and s["live"]["in_flight"] == 0
    text = g.get("/metrics").body.decode()
    for name in ("hatchery_playground_runs_total", "hatchery_playground_refusals_total",
                 "hatchery_playground_cache_hit_ratio", "hatchery_playground_in_flight"):
        assert name in text, name
    assert g.metric('hatchery_playground_runs_total{source="cache"}') == 1
    assert g.metric('hatchery_playground_runs_total{source="sandbox"}') == 1


def test_assets_cors_and_unknown_routes(gateway_factory):
    g = gateway_factory("--allow-origin", "https://docs.example")
    for path, ctype in (("/playground/widget.js", "text/javascript"), ("/playground/widget.css", "text/css"),
                        ("/playground/demo", "text/html")):
        r = g.get(path)
        assert r.status == 200 and r.headers["content-type"].startswith(ctype), (path, r)
    assert b"data-hatchery-run" in g.get("/playground/demo").body
    pre = g.request("OPTIONS", "/playground/run", headers={
        "Origin": "https://docs.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type"})
    assert pre.status == 204
    assert pre.headers["access-control-allow-origin"] == "https://docs.example"
    assert "POST" in pre.headers["access-control-allow-methods"]
    other = g.request("OPTIONS", "/playground/run", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in {k.lower() for k in other.headers}
    assert_error(g.get("/nope"), 404, "not_found")
    assert_error(g.get("/playground/run"), 405, "method_not_allowed")


def test_sigterm_lets_runs_finish_and_clean_up(gateway_factory, daemon):
    g = gateway_factory(*TRUST)
    conn, r = g.open_run(f"# {uuid.uuid4().hex}\nimport time\nprint('a', flush=True)\ntime.sleep(1.5)\nprint('b')\n",
                         ip=ip())
    read_sse_until_stdout(r)
    g.proc.send_signal(signal.SIGTERM)
    from pg_harness import read_sse
    events, _ = read_sse(r)
    conn.close()
    assert "".join(d["data"] for e, d in events if e == "stdout").endswith("b\n"), events
    assert events[-1][0] == "exit" and events[-1][1]["exit_code"] == 0, events
    assert g.proc.wait(15) == 0
    assert sandboxes(daemon) == []


def test_no_sandbox_left_after_suite(daemon):
    # Runs last in this module (pytest keeps file order).
    assert_no_sandboxes(daemon)
    assert os.path.isdir(daemon.data_dir)
