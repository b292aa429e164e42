"""Bad input on both E2B surfaces, in raw HTTP: every refusal in the
protocol's own shape (E2B's `{code, message}`, or Connect's error codes),
and the sandbox and daemon keep working afterwards."""

import http.client
import json
import struct
import time

import pytest
from harness import KEY


def req(d, method, path, body=None, headers=None, timeout=60, port=None):
    conn = http.client.HTTPConnection("127.0.0.1", port or d.port, timeout=timeout)
    conn.request(method, path, body=body, headers=headers or {})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, dict(r.getheaders()), data


def envd_headers(sbx, token=None, port=49983, **extra):
    h = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": str(port),
         "X-Access-Token": token if token is not None else sbx._envd_access_token}
    h.update(extra)
    return h


def envelope(obj, flags=0):
    b = json.dumps(obj).encode() if not isinstance(obj, bytes) else obj
    return struct.pack(">BI", flags, len(b)) + b


def end_stream_error(data):
    """The error of a Connect stream's end-of-stream envelope."""
    i, last = 0, None
    while i + 5 <= len(data):
        flags, n = struct.unpack(">BI", data[i:i + 5])
        last = (flags, json.loads(data[i + 5:i + 5 + n]))
        i += 5 + n
    assert last and last[0] & 2, data
    return last[1].get("error")


def test_control_plane_refusals(daemon):
    k = {"X-API-KEY": KEY, "Content-Type": "application/json"}
    s, _, b = req(daemon, "GET", "/e2b/v2/sandboxes", headers={"X-API-KEY": "wrong"})
    assert s == 401 and json.loads(b)["code"] == 401
    s, _, b = req(daemon, "GET", "/e2b/v2/sandboxes")
    assert s == 401 and "message" in json.loads(b)
    s, _, b = req(daemon, "POST", "/e2b/v2/sandboxes", json.dumps({"templateID": "nope"}), k)
    assert s == 404 and json.loads(b) == {"code": 404, "message": "template 'nope' not found"}
    s, _, b = req(daemon, "POST", "/e2b/v2/sandboxes", json.dumps({"templateID": "base", "timeout": -1}), k)
    assert s == 400 and json.loads(b)["code"] == 400
    s, _, b = req(daemon, "POST", "/e2b/v2/sandboxes", b"{not json", k)
    assert s == 400 and json.loads(b)["code"] == 400
    s, _, b = req(daemon, "POST", "/e2b/v2/sandboxes", json.dumps({"templateID": "base", "volumeMounts": [{"name": "v", "path": "/v"}]}), k)
    assert s == 400 and "not supported" in json.loads(b)["message"]
    s, _, b = req(daemon, "GET", "/e2b/sandboxes/sbx_doesnotexist0000", headers=k)
    assert s == 404 and json.loads(b)["code"] == 404
    s, _, b = req(daemon, "DELETE", "/e2b/sandboxes/sbx_doesnotexist0000", headers=k)
    assert s == 404
    s, _, b = req(daemon, "GET", "/e2b/v2/sandboxes?limit=0", headers=k)
    assert s == 400
    s, _, b = req(daemon, "GET", "/e2b/v2/sandboxes?nextToken=garbage", headers=k)
    assert s == 400
    s, _, b = req(daemon, "GET", "/e2b/no/such/route", headers=k)
    assert s == 404 and json.loads(b)["code"] == 404
    # Nothing was half-created.
    assert daemon.request("GET", "/v1/sandboxes").json()["sandboxes"] == []


def test_sandbox_routing_refusals(daemon, sbx):
    from e2b import Sandbox
    other = Sandbox.create("base")
    try:
        # No sandbox header; an unknown sandbox; another sandbox's token.
        s, _, b = req(daemon, "GET", "/e2b/sandbox/health")
        assert s == 400
        h = envd_headers(sbx)
        h["E2b-Sandbox-Id"] = "sbx_doesnotexist0000"
        s, _, b = req(daemon, "GET", "/e2b/sandbox/health", headers=h)
        assert s == 401  # the token names another sandbox
        h["X-Access-Token"], h["X-API-KEY"] = "", KEY
        s, _, b = req(daemon, "GET", "/e2b/sandbox/health", headers=h)
        assert s == 502 and "was not found" in json.loads(b)["message"]
        s, _, b = req(daemon, "GET", "/e2b/sandbox/health", headers=envd_headers(sbx, token=other._envd_access_token))
        assert s == 401 and json.loads(b)["code"] == 401
        s, _, b = req(daemon, "GET", "/e2b/sandbox/health", headers=envd_headers(sbx, token="zz"))
        assert s == 401
        s, _, _ = req(daemon, "GET", "/e2b/sandbox/health", headers=envd_headers(sbx))
        assert s == 204
        # Relayed ports (guest servers) are served on the preview listener,
        # never on the API's origin. A port nothing listens on, then one
        # something does.
        preview = daemon.preview_port
        s, _, b = req(daemon, "GET", "/e2b/sandbox/", headers=envd_headers(sbx, port=8123), port=preview)
        assert s == 502 and "port is not open" in json.loads(b)["message"]
        # A malformed port names no guest server: the API's listener says so.
        s, _, b = req(daemon, "GET", "/e2b/sandbox/", headers=envd_headers(sbx, port=0))
        assert s == 400
        sbx.commands.run("cd /tmp && echo served > index.html && python3 -m http.server 8123", background=True)
        deadline = time.time() + 30
        while time.time() < deadline:
            s, _, b = req(daemon, "GET", "/e2b/sandbox/index.html", headers=envd_headers(sbx, port=8123), port=preview)
            if s == 200:
                break
            time.sleep(0.3)
        assert (s, b) == (200, b"served\n")
        s, _, b = req(daemon, "GET", "/e2b/sandbox/index.html", headers=envd_headers(sbx, port=8123))
        assert s == 421 and f"127.0.0.1:{preview}/e2b/sandbox" in json.loads(b)["message"], b
        # A worker script fetch is refused there too.
        s, _, b = req(daemon, "GET", "/e2b/sandbox/index.html", port=preview,
                      headers=envd_headers(sbx, port=8123, **{"Service-Worker": "script"}))
        assert s == 403, b
        # envd is the API's: not on the preview listener.
        s, _, _ = req(daemon, "GET", "/e2b/sandbox/health", headers=envd_headers(sbx), port=preview)
        assert s == 404
    finally:
        other.kill()


def test_connect_protocol_refusals(daemon, sbx):
    base = "/e2b/sandbox/process.Process/"
    stream = envd_headers(sbx, **{"Content-Type": "application/connect+json"})
    unary = envd_headers(sbx, **{"Content-Type": "application/json"})
    # Oversized envelope: refused from its header, before a body arrives.
    s, _, b = req(daemon, "POST", base + "Start", struct.pack(">BI", 0, 0xFFFFFFFF), stream)
    assert s == 200 and end_stream_error(b)["code"] == "resource_exhausted"
    # Truncated envelope, two messages, compressed flag, unknown flags.
    ok = envelope({"process": {"cmd": "/bin/true"}})
    for body, code in [(ok[:7], "invalid_argument"), (ok + ok, "invalid_argument"),
                       (envelope({"process": {"cmd": "/bin/true"}}, flags=1), "unimplemented"),
                       (envelope({}, flags=0x80), "invalid_argument"),
                       (envelope(b"{not json"), "invalid_argument"),
                       (envelope({"process": {"cmd": ""}}), "invalid_argument"),
                       (envelope({"process": {"cmd": "/bin/true"}, "pty": {"size": {"cols": 0, "rows": 5}}}), "invalid_argument")]:
        s, _, b = req(daemon, "POST", base + "Start", body, stream)
        assert s == 200 and end_stream_error(b)["code"] == code, (body, b)
    # Unary: bad JSON, unknown field values, unknown method, wrong codec.
    s, _, b = req(daemon, "POST", base + "SendSignal", b"{bad", unary)
    assert s == 400 and json.loads(b)["code"] == "invalid_argument"
    s, _, b = req(daemon, "POST", base + "SendSignal", json.dumps({"process": {"pid": 999999}, "signal": "SIGNAL_SIGKILL"}), unary)
    assert s == 404 and json.loads(b)["code"] == "not_found"
    s, _, b = req(daemon, "POST", base + "Frobnicate", b"{}", unary)
    assert s == 501 and json.loads(b)["code"] == "unimplemented"
    s, _, b = req(daemon, "POST", base + "List", b"\x00", envd_headers(sbx, **{"Content-Type": "application/proto"}))
    assert s == 501
    s, _, b = req(daemon, "POST", base + "Start", ok, dict(stream, **{"Connect-Timeout-Ms": "soon"}))
    assert end_stream_error(b)["code"] == "invalid_argument"
    s, _, b = req(daemon, "POST", base + "SendInput", b"x" * (3 << 20), unary)
    assert s == 429 and json.loads(b)["code"] == "resource_exhausted"
    s, _, b = req(daemon, "POST", "/e2b/sandbox/filesystem.Filesystem/ListDir", json.dumps({"path": "/etc", "depth": 1000}), unary)
    assert s == 400
    s, _, b = req(daemon, "POST", "/e2b/sandbox/filesystem.Filesystem/Remove", json.dumps({"path": "/"}), unary)
    assert s == 400
    # The right thing on the interpreter's port is a 404 there.
    s, _, b = req(daemon, "POST", base + "List", b"{}", envd_headers(sbx, port=49999, **{"Content-Type": "application/json"}))
    assert s == 404
    # Still alive, and a good stream ends cleanly.
    s, _, b = req(daemon, "POST", base + "Start", envelope({"process": {"cmd": "/bin/echo", "args": ["ok"]}}), stream)
    assert s == 200 and end_stream_error(b) is None and b"b2s" in b  # base64 of "ok\n" is "b2sK"
    assert sbx.commands.run("echo alive").stdout == "alive\n"
