"""Connect details the SDKs depend on but do not show, in raw HTTP:
keep-alive events on a silent stream, Connect-Timeout-Ms as the process's
lifetime, the StreamInput client stream, and streams whose sandbox is
killed ending with a dropped connection."""

import base64
import http.client
import json
import struct
import threading
import time

import pytest

from test_bad_input import envd_headers, envelope, req


def frames(data):
    out, i = [], 0
    while i + 5 <= len(data):
        flags, n = struct.unpack(">BI", data[i:i + 5])
        out.append((flags, json.loads(data[i + 5:i + 5 + n])))
        i += 5 + n
    assert i == len(data), "trailing bytes"
    return out


def events(fs):
    return [next(iter(f["event"])) if "event" in f else "?" for flags, f in fs if not flags & 2]


def test_keepalives_and_deadline(daemon, sbx):
    h = envd_headers(sbx, **{"Content-Type": "application/connect+json", "Keepalive-Ping-Interval": "1"})
    start = envelope({"process": {"cmd": "/bin/sh", "args": ["-c", "sleep 3; echo done"]}})
    s, _, b = req(daemon, "POST", "/e2b/sandbox/process.Process/Start", start, h)
    fs = frames(b)
    ev = events(fs)
    assert s == 200 and ev[0] == "start" and ev[-1] == "end", ev
    assert ev.count("keepalive") >= 1, ev
    assert fs[-1] == (2, {}), fs[-1]
    # The deadline ends the process, not just the stream.
    h = envd_headers(sbx, **{"Content-Type": "application/connect+json", "Connect-Timeout-Ms": "1500"})
    t = time.time()
    s, _, b = req(daemon, "POST", "/e2b/sandbox/process.Process/Start",
                  envelope({"process": {"cmd": "/bin/sleep", "args": ["30"]}}), h)
    fs = frames(b)
    assert time.time() - t < 15
    assert fs[-1][0] == 2 and fs[-1][1]["error"]["code"] == "deadline_exceeded", fs
    pid = fs[0][1]["event"]["start"]["pid"]
    assert pid not in [p.pid for p in sbx.commands.list()]


def test_stream_input(daemon, sbx):
    h = sbx.commands.run("cat; echo eof", background=True, stdin=True)
    body = (envelope({"start": {"process": {"pid": h.pid}}})
            + envelope({"data": {"input": {"stdin": base64.b64encode(b"one\n").decode()}}})
            + envelope({"keepalive": {}})
            + envelope({"data": {"input": {"stdin": base64.b64encode(b"two\n").decode()}}})
            + envelope({}, flags=2))
    s, _, b = req(daemon, "POST", "/e2b/sandbox/process.Process/StreamInput", body,
                  envd_headers(sbx, **{"Content-Type": "application/connect+json"}))
    assert s == 200 and frames(b)[-1] == (2, {}), b
    sbx.commands.close_stdin(h.pid)
    assert h.wait().stdout == "one\ntwo\neof\n"
    # Data before the start message is refused.
    s, _, b = req(daemon, "POST", "/e2b/sandbox/process.Process/StreamInput",
                  envelope({"data": {"input": {"stdin": "eA=="}}}) + envelope({}, flags=2),
                  envd_headers(sbx, **{"Content-Type": "application/connect+json"}))
    assert frames(b)[-1][1]["error"]["code"] == "invalid_argument"


def read_until_dropped(conn):
    """A streamed response's body, and whether it ended by the connection
    dropping (no last chunk) rather than cleanly."""
    r = conn.getresponse()
    assert r.status == 200
    got = b""
    try:
        while True:
            chunk = r.read1(65536)
            if not chunk:
                return got, False
            got += chunk
    except (http.client.IncompleteRead, ConnectionError):
        return got, True


def kill_soon(sbx, after=1.5):
    t = threading.Timer(after, sbx.kill)
    t.start()
    return t


@pytest.mark.parametrize("kind", ["envd", "pty", "interpreter"])
def test_a_stream_whose_sandbox_is_killed_drops_its_connection(daemon, kind):
    # What E2B's SDKs (python 2.45.1 on) take as "the sandbox was killed": the
    # connection drops mid-response, then /health answers 502. An error in
    # the stream would be an ordinary error, or for the interpreter a run
    # that returned normally.
    from e2b import Sandbox
    from e2b_code_interpreter import Sandbox as CodeSandbox
    sbx = (CodeSandbox.create(timeout=120) if kind == "interpreter" else Sandbox.create("base", timeout=120))
    conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=60)
    if kind == "envd":
        h = envd_headers(sbx, **{"Content-Type": "application/connect+json"})
        conn.request("POST", "/e2b/sandbox/process.Process/Start",
                     envelope({"process": {"cmd": "/bin/sh", "args": ["-c", "echo up; sleep 60"]}}), h)
    elif kind == "pty":
        h = envd_headers(sbx, **{"Content-Type": "application/connect+json"})
        conn.request("POST", "/e2b/sandbox/process.Process/Start",
                     envelope({"process": {"cmd": "/bin/sh", "args": ["-c", "echo up; sleep 60"]},
                               "pty": {"size": {"cols": 80, "rows": 24}}}), h)
    else:
        h = envd_headers(sbx, port=49999, **{"Content-Type": "application/json"})
        conn.request("POST", "/e2b/sandbox/execute",
                     json.dumps({"code": "print('up')\nimport time; time.sleep(60)"}), h)
    timer = kill_soon(sbx)
    try:
        got, dropped = read_until_dropped(conn)
    finally:
        timer.cancel()
        conn.close()
    assert dropped, got[-300:]
    # What came before the kill was delivered ("up\n" is base64 in envd's JSON).
    expect = {"envd": b'"dXAK"', "pty": b'"dXANCg=="', "interpreter": b'"up\\n"'}[kind]
    assert expect in got, got
    s, _, b = req(daemon, "GET", "/e2b/sandbox/health", headers=envd_headers(sbx))
    assert s == 502 and b"was not found" in b, (s, b)
