import json
import time

import pytest

from harness import KEY

# One daemon for the module's tests (tests/integration/conftest.py).
SHARED_DAEMON = True


def test_healthz_is_open_everything_else_needs_the_key(daemon):
    assert daemon.request("GET", "/healthz", auth=False).status == 200
    r = daemon.request("GET", "/v1/sandboxes", auth=False)
    assert r.status == 401 and r.error_code() == "unauthorized"
    r = daemon.request("GET", "/v1/sandboxes", auth=False, headers={"Authorization": "Bearer wrong"})
    assert r.status == 401
    assert daemon.request("GET", "/metrics", auth=False).status == 401
    r = daemon.request("GET", "/v1/nope")
    assert r.status == 404 and r.error_code() == "not_found"


def test_create_get_list_patch_delete(daemon):
    t0 = time.time()
    r = daemon.request("POST", "/v1/sandboxes", {"ttl_seconds": 60, "metadata": {"candidate": "c-42"}})
    assert r.status == 201, r
    sb = r.json()
    daemon.created.add(sb["id"])
    assert sb["id"].startswith("sbx_") and sb["template"] == "code-interpreter"
    assert sb["state"] == "running" and sb["metadata"] == {"candidate": "c-42"}
    other = daemon.create(metadata={"candidate": "c-7"})

    got = daemon.request("GET", f"/v1/sandboxes/{sb['id']}").json()
    assert got["expires_at"] == sb["expires_at"]
    ids = {s["id"] for s in daemon.request("GET", "/v1/sandboxes").json()["sandboxes"]}
    assert ids == {sb["id"], other}
    filt = daemon.request("GET", "/v1/sandboxes?metadata.candidate=c-42").json()["sandboxes"]
    assert [s["id"] for s in filt] == [sb["id"]]
    assert daemon.request("GET", "/v1/sandboxes?metadata.candidate=c-42&metadata.x=y").json()["sandboxes"] == []

    r = daemon.request("PATCH", f"/v1/sandboxes/{sb['id']}", {"ttl_seconds": 1200})
    assert r.status == 200, r
    assert r.json()["expires_at"] > sb["expires_at"]

    assert daemon.delete(sb["id"]).status == 204
    assert daemon.delete(sb["id"]).status == 204, "delete is idempotent"
    assert daemon.request("GET", f"/v1/sandboxes/{sb['id']}").status == 404
    assert daemon.delete("sbx_doesnotexist0000").status == 204
    assert time.time() - t0 < 60


def test_files_roundtrip_list_and_remove(daemon, sandbox):
    blob = bytes(range(256)) * 4096  # 1 MiB, binary
    assert daemon.put_file(sandbox, "/work/deep/dir/blob.bin", blob).status == 204
    r = daemon.get_file(sandbox, "/work/deep/dir/blob.bin")
    assert r.status == 200 and r.body == blob
    daemon.put_file(sandbox, "/work/deep/a.txt", b"hi")
    r = daemon.request("GET", f"/v1/sandboxes/{sandbox}/files/list?path=/work/deep")
    entries = {e["name"]: e for e in r.json()["entries"]}
    assert entries["a.txt"]["type"] == "file" and entries["a.txt"]["size"] == 2
    assert entries["dir"]["type"] == "dir"
    assert entries["a.txt"]["mtime"] > 1_600_000_000
    assert daemon.request("DELETE", f"/v1/sandboxes/{sandbox}/files?path=/work/deep/a.txt").status == 204
    r = daemon.get_file(sandbox, "/work/deep/a.txt")
    assert r.status == 404 and r.error_code() == "file_not_found"
    r = daemon.request("DELETE", f"/v1/sandboxes/{sandbox}/files?path=/work/deep/a.txt")
    assert r.status == 404
    # The written file is visible to commands.
    assert daemon.exec(sandbox, "wc -c < /work/deep/dir/blob.bin")["stdout"].strip() == str(len(blob))


def test_exec_shapes(daemon):
    sid = daemon.create(env={"FROM_CREATE": "c"})
    r = daemon.exec(sid, "echo out; echo err >&2; exit 3")
    assert (r["exit_code"], r["stdout"], r["stderr"]) == (3, "out\n", "err\n")
    assert r["timed_out"] is False and r["truncated"] is False and r["oom_killed"] is False
    assert r["duration_ms"] >= 0 and r["cpu_ms"] >= 0
    r = daemon.exec(sid, argv=["python3", "-c", "import sys; print(sys.argv[1:])", "a b", "$HOME"])
    assert r["stdout"] == "['a b', '$HOME']\n"
    r = daemon.exec(sid, "cat; echo $FROM_CREATE $FROM_EXEC; pwd", stdin="piped\n",
                    env={"FROM_EXEC": "e"}, cwd="/tmp")
    assert r["stdout"] == "piped\nc e\n/tmp\n"
    r = daemon.exec(sid, "kill -9 $$")
    assert r["exit_code"] == 137, "signal N reports 128+N"
    r = daemon.exec(sid, argv=["no-such-binary"])
    assert r["exit_code"] == 127
    r = daemon.exec(sid, "python3 -c 'import json, http, sqlite3, ssl; print(1)' && ls / && ps aux | head -1")
    assert r["exit_code"] == 0, r


def test_exec_timeout_and_truncation(daemon, sandbox):
    t = time.time()
    r = daemon.exec(sandbox, "while :; do :; done", timeout_seconds=2)
    assert r["timed_out"] is True and r["exit_code"] == 137
    assert 1.5 < time.time() - t < 6
    r = daemon.exec(sandbox, "head -c 100000 /dev/zero | tr '\\0' x", max_output_bytes=1000)
    assert r["truncated"] is True and len(r["stdout"]) == 1000
    assert daemon.exec(sandbox, "echo still here")["stdout"] == "still here\n"


def test_exec_stream_events_arrive_live(daemon, sandbox):
    times = []
    events = daemon.stream(sandbox, {"cmd": "for i in 1 2 3; do echo $i; sleep 0.3; done; echo e >&2"},
                           on_event=lambda ev: times.append(time.time()))
    kinds = [e for e, _ in events]
    assert kinds[-1] == "exit" and kinds.count("exit") == 1
    out = "".join(d["data"] for e, d in events if e == "stdout")
    assert out == "1\n2\n3\n"
    assert "".join(d["data"] for e, d in events if e == "stderr") == "e\n"
    assert events[-1][1]["exit_code"] == 0
    # Output was streamed as produced, not at the end.
    assert times[-1] - times[0] > 0.5


def test_stream_disconnect_kills_the_command(daemon, sandbox):
    def first_line(ev):
        # Hang up once the command has shown it runs (its first output).
        return "started" not in json.dumps(ev[1])
    events = daemon.stream(sandbox, {"cmd": "touch /tmp/began; echo started; sleep 3; echo survived > /tmp/flag"},
                           on_event=first_line)
    assert "started" in json.dumps(events[-1][1]), events
    time.sleep(4.5)
    # It did start (so "not there" below is the kill, not a command that never ran)...
    assert daemon.exec(sandbox, "test -e /tmp/began && echo began")["stdout"] == "began\n"
    # ...and the hang-up killed it before its last step.
    r = daemon.exec(sandbox, "cat /tmp/flag 2>/dev/null || echo killed")
    assert r["stdout"] == "killed\n"


def test_ttl_expiry_kills_and_cleans(daemon):
    sid = daemon.create(ttl_seconds=2)
    time.sleep(3.5)
    assert daemon.request("GET", f"/v1/sandboxes/{sid}").status == 404
    r = daemon.request("POST", f"/v1/sandboxes/{sid}/exec", {"cmd": "true"})
    assert r.status in (404, 409)
    daemon.wait_no_leftovers()


@pytest.mark.fresh_daemon  # reads absolute counters
def test_metrics_count_what_happened(daemon, sandbox):
    daemon.exec(sandbox, "true")
    daemon.exec(sandbox, "sleep 5", timeout_seconds=1)
    m = daemon.request("GET", "/metrics").body.decode()
    for name in ["hatchery_sandboxes_live 1", "hatchery_sandboxes_created_total 1", "hatchery_execs_total 2",
                 "hatchery_exec_timeouts_total 1", "hatchery_exec_seconds_bucket", "hatchery_sandbox_create_seconds_bucket",
                 "hatchery_exec_oom_kills_total 0"]:
        assert name in m, name
    daemon.delete(sandbox)
    m = daemon.request("GET", "/metrics").body.decode()
    assert 'hatchery_sandboxes_killed_total{reason="deleted"} 1' in m
    assert "hatchery_sandboxes_live 0" in m
