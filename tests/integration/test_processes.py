"""Background processes: start at once, list, replay and follow output
from any offset, stdin, signals, wait, kill; raw-byte output."""

import base64
import time

import pytest

# One daemon for the module's tests (tests/integration/conftest.py).
SHARED_DAEMON = True


def start(daemon, sid, cmd, **kw):
    r = daemon.request("POST", f"/v1/sandboxes/{sid}/exec", dict(kw, cmd=cmd, background=True))
    assert r.status == 202, r
    return r.json()


def output(daemon, sid, pid, **q):
    qs = "&".join(f"{k}={str(v).lower()}" for k, v in q.items())
    return daemon.stream(sid, None, method="GET", path=f"/v1/sandboxes/{sid}/processes/{pid}/output?{qs}")


def test_background_lifecycle(daemon, sandbox):
    t = time.time()
    p = start(daemon, sandbox, "for i in 1 2 3; do echo line$i; sleep 0.3; done; echo err >&2; exit 7")
    assert time.time() - t < 1.0, "a background start answers at once"
    assert p["id"].startswith("proc_") and p["state"] == "running" and p["argv"][0] == "/bin/sh"
    listed = daemon.request("GET", f"/v1/sandboxes/{sandbox}/processes").json()["processes"]
    assert [x["id"] for x in listed] == [p["id"]]
    # Following the output from the start: every line, then the exit.
    events = output(daemon, sandbox, p["id"], follow=True)
    assert events[-1][0] == "exit" and events[-1][1]["exit_code"] == 7 and events[-1][1]["reason"] == "exited"
    out = "".join(d["data"] for e, d in events if e == "stdout")
    assert out == "line1\nline2\nline3\n" and any(e == "stderr" for e, _ in events)
    # Replay from an offset: exactly the bytes after it.
    events = output(daemon, sandbox, p["id"], offset=6, follow=False)
    first = [d for e, d in events if e == "stdout"][0]
    assert first["offset"] == 6 and first["data"].startswith("line2"), events
    info = daemon.request("GET", f"/v1/sandboxes/{sandbox}/processes/{p['id']}").json()
    assert info["state"] == "exited" and info["output_bytes"] == 22


def test_stdin_signal_wait_kill(daemon, sandbox):
    p = start(daemon, sandbox, "while read l; do echo got:$l; done; echo bye")
    r = daemon.request("POST", f"/v1/sandboxes/{sandbox}/processes/{p['id']}/stdin", raw=b"one\ntwo\n")
    assert r.status == 204, r
    assert daemon.request("POST", f"/v1/sandboxes/{sandbox}/processes/{p['id']}/stdin/close").status == 204
    r = daemon.request("POST", f"/v1/sandboxes/{sandbox}/processes/{p['id']}/wait?timeout_seconds=10")
    assert r.json()["state"] == "exited" and r.json()["exit_code"] == 0, r
    out = "".join(d["data"] for e, d in output(daemon, sandbox, p["id"], follow=False) if e == "stdout")
    assert out == "got:one\ngot:two\nbye\n"
    r = daemon.request("POST", f"/v1/sandboxes/{sandbox}/processes/{p['id']}/stdin", raw=b"late")
    assert r.status == 409, r

    p = start(daemon, sandbox, "trap 'echo term; exit 3' TERM; while :; do sleep 0.1; done")
    time.sleep(0.5)
    r = daemon.request("POST", f"/v1/sandboxes/{sandbox}/processes/{p['id']}/signal", {"signal": "SIGTERM"})
    assert r.status == 200, r
    r = daemon.request("POST", f"/v1/sandboxes/{sandbox}/processes/{p['id']}/wait?timeout_seconds=10").json()
    assert r["exit_code"] == 3, r
    r = daemon.request("POST", f"/v1/sandboxes/{sandbox}/processes/{p['id']}/wait?timeout_seconds=1").json()
    assert r["state"] == "exited"

    # A server with a detached helper: kill takes the whole unit.
    p = start(daemon, sandbox, "setsid sleep 321 & exec sleep 322")
    r = daemon.request("POST", f"/v1/sandboxes/{sandbox}/processes/{p['id']}/wait?timeout_seconds=1").json()
    assert r["state"] == "running"
    r = daemon.request("DELETE", f"/v1/sandboxes/{sandbox}/processes/{p['id']}")
    assert r.status == 200 and r.json()["state"] == "exited" and r.json()["reason"] == "cancelled", r
    left = daemon.exec(sandbox, "ps -eo args --no-headers | grep -c '^sleep 32[12]' || true")["stdout"]
    assert left.strip() == "0", left


def test_follow_reconnect_and_timeout(daemon, sandbox):
    p = start(daemon, sandbox, "i=0; while [ $i -lt 30 ]; do echo tick$i; i=$((i+1)); sleep 0.05; done")
    got = []
    # Read a bit, disconnect, reconnect from where we stopped.
    events = output(daemon, sandbox, p["id"], follow=True) if False else None
    first = daemon.stream(sandbox, None, method="GET", path=f"/v1/sandboxes/{sandbox}/processes/{p['id']}/output",
                          on_event=lambda ev: False if ev[0] == "stdout" else None)
    d = first[0][1]
    got.append(d["data"])
    rest = output(daemon, sandbox, p["id"], offset=d["offset"] + len(d["data"].encode()), follow=True)
    got += [x["data"] for e, x in rest if e == "stdout"]
    assert "".join(got) == "".join(f"tick{i}\n" for i in range(30))
    # The process survived the disconnect (it was only a reader).
    p = start(daemon, sandbox, "sleep 30", timeout_seconds=1)
    r = daemon.request("POST", f"/v1/sandboxes/{sandbox}/processes/{p['id']}/wait?timeout_seconds=10").json()
    assert r["reason"] == "timeout", r


def test_ring_keeps_the_last_mib(daemon, sandbox):
    p = start(daemon, sandbox, "head -c 3000000 /dev/zero | tr '\\0' a; echo END")
    daemon.request("POST", f"/v1/sandboxes/{sandbox}/processes/{p['id']}/wait?timeout_seconds=20")
    info = daemon.request("GET", f"/v1/sandboxes/{sandbox}/processes/{p['id']}").json()
    assert info["output_bytes"] == 3000004 and info["first_offset"] >= 3000004 - (1 << 20) - 65536, info
    events = output(daemon, sandbox, p["id"], follow=False)
    data = "".join(d["data"] for e, d in events if e == "stdout")
    assert data.endswith("END\n") and len(data) <= (1 << 20) + 65536
    assert [d for e, d in events if e == "stdout"][0]["offset"] == info["first_offset"]


def test_raw_bytes_and_split_characters(daemon, sandbox):
    # Bytes that are not UTF-8 come back exactly in base64.
    r = daemon.exec(sandbox, "printf '\\377\\000\\001'", output="base64")
    assert base64.b64decode(r["stdout"]) == b"\xff\x00\x01", r
    # A 3-byte character written one byte at a time is never garbled in
    # text mode, even though each byte arrives in its own chunk.
    events = daemon.stream(sandbox, {"cmd": "for b in '\\342' '\\202' '\\254'; do printf $b; sleep 0.2; done"})
    assert "".join(d["data"] for e, d in events if e == "stdout") == "€", events
    events = daemon.stream(sandbox, {"cmd": "printf '\\377'", "output": "base64"})
    assert [base64.b64decode(d["data"]) for e, d in events if e == "stdout"] == [b"\xff"]


def test_background_caps_and_bad_input(daemon, sandbox):
    ids = []
    for _ in range(16):
        r = daemon.request("POST", f"/v1/sandboxes/{sandbox}/exec", {"argv": ["sleep", "60"], "background": True})
        assert r.status == 202, r
        ids.append(r.json()["id"])
    r = daemon.request("POST", f"/v1/sandboxes/{sandbox}/exec", {"argv": ["sleep", "60"], "background": True})
    assert r.status == 429 and r.error_code() == "too_many", r
    for pid in ids[:2]:
        daemon.request("DELETE", f"/v1/sandboxes/{sandbox}/processes/{pid}")
    assert start(daemon, sandbox, "true")["state"] in ("running", "exited")
    other = daemon.create()
    r = daemon.request("GET", f"/v1/sandboxes/{other}/processes/{ids[5]}")
    assert r.status == 404 and r.error_code() == "process_not_found", r
    r = daemon.request("GET", f"/v1/sandboxes/{sandbox}/processes/1234")
    assert r.status == 400, r
    r = daemon.request("POST", f"/v1/sandboxes/{sandbox}/processes/{ids[5]}/signal", {"signal": "SIGSEGV"})
    assert r.status == 400, r
    r = daemon.request("POST", f"/v1/sandboxes/{sandbox}/processes/{ids[5]}/stdin", raw=b"x" * ((1 << 20) + 1))
    assert r.status == 413, r
    r = daemon.request("POST", f"/v1/sandboxes/{sandbox}/processes/{ids[5]}/wait?timeout_seconds=301")
    assert r.status == 400, r
    r = daemon.request("POST", f"/v1/sandboxes/{sandbox}/exec/stream", {"cmd": "true", "background": True})
    assert r.status == 400, r
    r = daemon.request("POST", f"/v1/sandboxes/{sandbox}/exec", {"cmd": "true", "output": "hex"})
    assert r.status == 400, r
    # Deleting the sandbox takes every background process (the harness
    # checks nothing is left on the host).
