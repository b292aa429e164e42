"""run_code: code runs in an interpreter that is already running in the
sandbox (restored with it from the template checkpoint), with notebook-like
contexts, rich results, and the same containment as exec."""

import concurrent.futures
import time

import pytest

# One daemon for the module's tests (tests/integration/conftest.py).
SHARED_DAEMON = True


def code(daemon, sid, src, **kw):
    r = daemon.request("POST", f"/v1/sandboxes/{sid}/code", dict(kw, code=src))
    assert r.status == 200, r
    return r.json()


def test_print_last_expression_and_persistence(daemon, sandbox):
    r = code(daemon, sandbox, "print('hi')\nx = 20\nx + 1")
    assert r["stdout"] == "hi\n" and r["error"] is None, r
    assert r["results"] == [{"data": {"text/plain": "21"}, "is_main_result": True}], r
    assert r["reason"] == "exited" and r["context_id"] == "default" and r["restarted"] is False
    assert r["execution_count"] == 1
    r = code(daemon, sandbox, "import json\nx * 2")
    assert r["results"][0]["data"]["text/plain"] == "40" and r["execution_count"] == 2
    assert code(daemon, sandbox, "json.dumps([1])")["results"][0]["data"]["text/plain"] == "'[1]'"
    # Output of child processes and of C-level writes comes back too.
    r = code(daemon, sandbox, "import subprocess, os\nsubprocess.run(['echo', 'child'])\nos.write(2, b'raw\\n')")
    assert "child\n" in r["stdout"] and "raw\n" in r["stderr"], r
    # env applies to this run only.
    r = code(daemon, sandbox, "import os\nos.environ.get('GREETING')", env={"GREETING": "hey"})
    assert r["results"][0]["data"]["text/plain"] == "'hey'"
    assert code(daemon, sandbox, "os.environ.get('GREETING')")["results"] == []


def test_rich_results_and_errors(daemon, sandbox):
    src = (
        "class T:\n"
        "    def _repr_html_(self): return '<b>t</b>'\n"
        "    def _repr_png_(self): return b'\\x89PNG'\n"
        "    def _repr_json_(self): return {'a': 1}\n"
        "display(T())\n"
        "T()"
    )
    r = code(daemon, sandbox, src)
    assert [x["is_main_result"] for x in r["results"]] == [False, True], r
    d = r["results"][1]["data"]
    assert d["text/html"] == "<b>t</b>" and d["image/png"] == "iVBORw==" and d["application/json"] == {"a": 1}
    r = code(daemon, sandbox, "def f():\n    return 1/0\nf()")
    assert r["error"]["name"] == "ZeroDivisionError" and r["error"]["value"] == "division by zero"
    assert "return 1/0" in r["error"]["traceback"] and "python_kernel" not in r["error"]["traceback"]
    assert r["reason"] == "exited" and r["restarted"] is False
    r = code(daemon, sandbox, "def (")
    assert r["error"]["name"] == "SyntaxError"
    r = code(daemon, sandbox, "import sys\nsys.exit(3)")
    assert r["error"]["name"] == "SystemExit" and r["error"]["value"] == "3" and r["restarted"] is False
    assert code(daemon, sandbox, "'alive'")["results"][0]["data"]["text/plain"] == "'alive'"


def test_stream_events_in_order(daemon, sandbox):
    times = []
    events = daemon.stream(sandbox, {"code": "import time\nprint('a', flush=True)\ntime.sleep(0.5)\nprint('b')\n42"},
                           path=f"/v1/sandboxes/{sandbox}/code/stream",
                           on_event=lambda ev: times.append(time.time()))
    kinds = [e for e, _ in events]
    assert kinds[-1] == "done" and kinds.count("done") == 1, events
    out = "".join(d["data"] for e, d in events if e == "stdout")
    assert out == "a\nb\n"
    assert kinds.index("result") < kinds.index("done")
    assert times[-1] - times[0] >= 0.4, "the first line must arrive before the sleep ends"
    events = daemon.stream(sandbox, {"code": "raise KeyError('k')"}, path=f"/v1/sandboxes/{sandbox}/code/stream")
    assert [e for e, _ in events] == ["error", "done"] and events[0][1]["name"] == "KeyError"
    assert events[1][1]["error"]["name"] == "KeyError"


def test_contexts(daemon, sandbox):
    code(daemon, sandbox, "secret = 1")
    r = daemon.request("POST", f"/v1/sandboxes/{sandbox}/code/contexts", {"cwd": "/tmp"})
    assert r.status == 201, r
    ctx = r.json()
    assert ctx["id"].startswith("ctx_") and ctx["cwd"] == "/tmp" and ctx["language"] == "python"
    r = code(daemon, sandbox, "import os\n('secret' in dir(), os.getcwd())", context_id=ctx["id"])
    assert r["results"][0]["data"]["text/plain"] == "(False, '/tmp')", r
    code(daemon, sandbox, "mine = 2", context_id=ctx["id"])
    ids = {c["id"] for c in daemon.request("GET", f"/v1/sandboxes/{sandbox}/code/contexts").json()["contexts"]}
    assert ids == {"default", ctx["id"]}
    r = daemon.request("POST", f"/v1/sandboxes/{sandbox}/code/contexts/{ctx['id']}/restart")
    assert r.status == 200 and r.json()["execution_count"] == 0, r
    r = code(daemon, sandbox, "'mine' in dir()", context_id=ctx["id"])
    assert r["results"][0]["data"]["text/plain"] == "False" and r["execution_count"] == 1
    # The default context was not touched by any of that.
    assert code(daemon, sandbox, "secret")["results"][0]["data"]["text/plain"] == "1"
    # Another sandbox cannot use this sandbox's context.
    other = daemon.create()
    r = daemon.request("POST", f"/v1/sandboxes/{other}/code", {"code": "1", "context_id": ctx["id"]})
    assert r.status == 404 and r.error_code() == "context_not_found", r
    assert daemon.request("DELETE", f"/v1/sandboxes/{sandbox}/code/contexts/{ctx['id']}").status == 204
    r = daemon.request("POST", f"/v1/sandboxes/{sandbox}/code", {"code": "1", "context_id": ctx["id"]})
    assert r.status == 404, r
    assert daemon.request("DELETE", f"/v1/sandboxes/{sandbox}/code/contexts/default").status == 400
    r = daemon.exec(sandbox, "ps -eo args --no-headers | grep -c python_kernel || true")


def test_fresh_sandboxes_start_clean(daemon):
    a = daemon.create()
    code(daemon, a, "leak = 'from a'")
    b = daemon.create()
    r = code(daemon, b, "'leak' in dir()")
    assert r["results"][0]["data"]["text/plain"] == "False" and r["execution_count"] == 1


def test_containment_kills_everything_the_code_started(daemon, sandbox):
    # Children (one detached, env cleared), threads and a busy loop: the
    # deadline takes all of them and the context comes back clean.
    src = (
        "import subprocess, threading, os\n"
        "subprocess.Popen(['sleep', '311'])\n"
        "subprocess.Popen(['setsid', 'env', '-i', '/bin/sleep', '312'])\n"
        "threading.Thread(target=lambda: [0 for _ in iter(int, 1)], daemon=True).start()\n"
        "state = 'dirty'\n"
        "while True: pass"
    )
    t = time.time()
    r = code(daemon, sandbox, src, timeout_seconds=2)
    assert r["reason"] == "timeout" and r["restarted"] is True, r
    assert time.time() - t < 6
    left = daemon.exec(sandbox, "ps -eo args --no-headers | grep -E '^(/bin/)?sleep 31[12]' || true")["stdout"]
    assert left.strip() == "", left
    r = code(daemon, sandbox, "'state' in dir()")
    assert r["results"][0]["data"]["text/plain"] == "False" and r["execution_count"] == 1, r


def test_fork_bomb_in_run_code_is_boring(daemon):
    victim, neighbour = daemon.create(), daemon.create()
    r = code(daemon, victim, "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass", timeout_seconds=4)
    assert r["reason"] == "timeout" and r["restarted"] is True, r
    n = daemon.exec(victim, "ps -e --no-headers | wc -l")["stdout"]
    assert int(n) < 12, n
    assert code(daemon, victim, "1+1")["results"][0]["data"]["text/plain"] == "2"
    assert code(daemon, neighbour, "'ok'")["results"][0]["data"]["text/plain"] == "'ok'"


def test_cpu_accounting_and_limit(daemon, sandbox):
    r = code(daemon, sandbox, "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.0: pass")
    assert r["reason"] == "exited" and 850 <= r["cpu_ms"] <= 1150, r
    r = code(daemon, sandbox, "x = 1\nwhile True: pass", timeout_seconds=20, cpu_limit_ms=600)
    assert r["reason"] == "cpu_limit" and 600 <= r["cpu_ms"] <= 750 and r["restarted"] is True, r


def test_the_interpreter_dying_is_reported_and_replaced(daemon, sandbox):
    r = code(daemon, sandbox, "import os\nos.kill(os.getpid(), 9)")
    assert r["reason"] == "signaled" and r["restarted"] is True, r
    assert r["error"]["name"] == "InterpreterDied" and "signal 9" in r["error"]["value"]
    r = code(daemon, sandbox, "import os\nos._exit(4)")
    assert r["restarted"] is True and "status 4" in r["error"]["value"], r
    assert code(daemon, sandbox, "2*3")["results"][0]["data"]["text/plain"] == "6"


def test_output_floods_are_capped(daemon, sandbox):
    t = time.time()
    r = code(daemon, sandbox, "while True: print('x' * 100)", max_output_bytes=50_000, timeout_seconds=20)
    assert r["reason"] == "output_limit" and r["truncated"] is True and len(r["stdout"]) == 50_000, r
    assert time.time() - t < 8
    r = code(daemon, sandbox, "import sys\nfor _ in range(10**6): sys.stderr.write('e' * 1000)",
             max_output_bytes=20_000, timeout_seconds=20)
    assert r["reason"] == "output_limit" and len(r["stderr"]) == 20_000, r
    r = code(daemon, sandbox, "while True: display('y' * 1000)", max_output_bytes=100_000, timeout_seconds=20)
    assert r["reason"] == "output_limit" and r["truncated"] is True and len(r["results"]) < 120, len(r["results"])
    assert code(daemon, sandbox, "'fine'")["reason"] == "exited"


def test_delete_during_a_run_answers(daemon):
    sid = daemon.create()
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        fut = ex.submit(daemon.request, "POST", f"/v1/sandboxes/{sid}/code", {"code": "while True: pass", "timeout_seconds": 60})
        time.sleep(1)
        assert daemon.delete(sid).status == 204
        r = fut.result(timeout=15)
    daemon.created.discard(sid)
    assert r.status in (200, 404, 409, 504), r


@pytest.mark.parametrize("body, status, err", [
    ({"code": "x" * (256 * 1024 + 1)}, 413, "too_large"),
    ({"code": "1", "language": "cobol"}, 400, "invalid_request"),
    ({"code": "1", "context_id": "ctx_0000000000000000"}, 404, "context_not_found"),
    ({"code": "1", "context_id": "../../x"}, 400, "invalid_request"),
    ({"code": "1", "timeout_seconds": 0}, 400, "invalid_request"),
    ({"code": "1", "timeout_seconds": 2, "cpu_limit_ms": 2001}, 400, "invalid_request"),
    ({"code": "1", "max_output_bytes": 0}, 400, "invalid_request"),
    ({"code": "1", "bogus": 1}, 400, None),
    ({}, 400, None),
])
def test_bad_input(daemon, sandbox, body, status, err):
    r = daemon.request("POST", f"/v1/sandboxes/{sandbox}/code", body)
    assert r.status == status, r
    if err:
        assert r.error_code() == err, r


def test_context_bad_input(daemon, sandbox):
    r = daemon.request("POST", f"/v1/sandboxes/{sandbox}/code/contexts", {"language": "cobol"})
    assert r.status == 400, r
    r = daemon.request("POST", f"/v1/sandboxes/{sandbox}/code/contexts", {"cwd": "/nope"})
    assert r.status == 404, r
    r = daemon.request("POST", f"/v1/sandboxes/{sandbox}/code/contexts", {"cwd": "relative"})
    assert r.status == 400, r
    made = []
    for _ in range(15):
        r = daemon.request("POST", f"/v1/sandboxes/{sandbox}/code/contexts", {})
        assert r.status == 201, r
        made.append(r.json()["id"])
    r = daemon.request("POST", f"/v1/sandboxes/{sandbox}/code/contexts", {})
    assert r.status == 409, r
    r = daemon.request("POST", f"/v1/sandboxes/{sandbox}/code/contexts/ctx_zz/restart")
    assert r.status == 400, r
    r = daemon.request("POST", f"/v1/sandboxes/nope/code", {"code": "1"})
    assert r.status == 404, r


def test_forks_resume_the_notebook(daemon, sandbox):
    # A snapshot keeps the contexts as they were; each fork resumes them
    # independently (a replay of an interview's session state).
    code(daemon, sandbox, "history = ['a']")
    snap = daemon.request("POST", f"/v1/sandboxes/{sandbox}/snapshots", {}).json()
    r = daemon.request("POST", f"/v1/snapshots/{snap['id']}/fork", {"count": 2})
    assert r.status == 201, r
    forks = [s["id"] for s in r.json()["sandboxes"]]
    daemon.created.update(forks)
    code(daemon, forks[0], "history.append('fork0')")
    assert code(daemon, forks[1], "history")["results"][0]["data"]["text/plain"] == "['a']"
    assert code(daemon, forks[0], "history")["results"][0]["data"]["text/plain"] == "['a', 'fork0']"
    assert code(daemon, sandbox, "history")["results"][0]["data"]["text/plain"] == "['a']"
    daemon.request("DELETE", f"/v1/snapshots/{snap['id']}")
