"""MCP over streamable HTTP (issue 37 item 5): the broker fronts servers
that speak the transport through the real `mcp` SDK (http_mcp.py), one
answering with event streams and one with JSON bodies, with the bearer
token the operator's config holds; a server given the wrong token is
reported in the tool catalog and offers nothing. Calls go through the
same recorded, policy-checked path as stdio servers' (test_broker_mcp.py).
The broker listens on each session's GET stream: a tool list change
announced there is seen before the next call, and a server's sampling
request is refused (JSON-RPC -32601), never run; both are logged."""

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time

import pytest

from broker_support import BrokerDaemon
from test_broker_mcp import VENV, answers, run_agent, text_of

HERE = os.path.dirname(__file__)
TOKEN = "mcp-host-held-token"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_listening(port, proc, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, "the MCP server exited"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"MCP server on {port} not listening")


@pytest.fixture
def hbd(model, git_server, push_server, forge):
    tmp = tempfile.mkdtemp(prefix="hxmcp-http-")
    log = os.path.join(tmp, "calls.log")
    procs, servers = [], []
    try:
        for name, mode in (("websse", "sse"), ("webjson", "json")):
            port = free_port()
            p = subprocess.Popen([os.path.join(VENV, "bin", "python"), os.path.join(HERE, "http_mcp.py"),
                                  str(port), TOKEN, mode, log], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(p)
            wait_listening(port, p)
            servers.append({"name": name, "transport": "http", "url": f"http://127.0.0.1:{port}/mcp",
                            "headers": {"Authorization": f"Bearer {TOKEN}"}, "call_timeout_s": 10})
        # The sse server again, with a token it refuses.
        servers.append(dict(servers[0], name="locked", headers={"Authorization": "Bearer wrong"}))
        cfg = os.path.join(tmp, "mcp.json")
        with open(cfg, "w") as f:
            json.dump({"servers": servers}, f)
        d = BrokerDaemon(model.port, git_server, push_server, forge, extra=["--broker-mcp-config", cfg]).start()
        d.mcp_log = log
        try:
            yield d
        finally:
            d.cleanup_sessions()
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def test_tools_over_streamable_http(hbd):
    pid = hbd.request("POST", "/v1/policies", {"name": "mcp-http", "rules": [
        {"id": "web-ok", "effect": "allow", "match": {"tools": ["mcp.websse.*", "mcp.webjson.*"]}}]}).json()["id"]
    calls = [
        [1, "mcp.websse.echo", {"text": "over sse"}, {}],
        [2, "mcp.webjson.echo", {"text": "over json"}, {}],
        # Retried: the stored answer, the tool ran once.
        [3, "mcp.websse.echo", {"text": "once"}, {"repeat": 3}],
    ]
    sid = run_agent(hbd, "mcp-http", calls, pid)
    hbd.wait_state(sid, "completed", timeout=300)
    hbd.track_sandboxes(sid)
    got, tools = answers(hbd, sid)
    assert {"mcp.websse.echo", "mcp.webjson.echo"} <= set(tools["tools"]), tools
    assert not any(n.startswith("mcp.locked.") for n in tools["tools"]), tools
    locked = [e for e in tools["errors"] if e.get("server") == "locked"]
    assert locked and "401" in json.dumps(locked), tools["errors"]
    a = got[1][0]
    assert a["status"] == "done" and text_of(a) == "sse: over sse", a
    a = got[2][0]
    assert a["status"] == "done" and text_of(a) == "json: over json", a
    assert [x["status"] for x in got[3]] == ["done"] * 3 and all(x == got[3][0] for x in got[3]), got[3]
    log = open(hbd.mcp_log).read().splitlines()
    assert sorted(log) == ["echo once", "echo over json", "echo over sse"], log
    # The token stays on the host: not in the session's events.
    assert TOKEN not in json.dumps(hbd.all_events(sid))


def test_server_messages_on_the_get_stream(hbd):
    pid = hbd.request("POST", "/v1/policies", {"name": "mcp-get", "rules": [
        {"id": "web-ok", "effect": "allow", "match": {"tools": ["mcp.websse.*"]}}]}).json()["id"]
    calls = [
        # Not listed yet.
        [1, "mcp.websse.late", {"text": "too early"}, {}],
        # Adds it, and says so on the GET stream only.
        [2, "mcp.websse.grow", {}, {}],
        [3, "mcp.websse.late", {"text": "now"}, {}],
        # The server asks the broker to sample a model: refused.
        [4, "mcp.websse.ask", {}, {}],
    ]
    sid = run_agent(hbd, "mcp-get", calls, pid)
    hbd.wait_state(sid, "completed", timeout=300)
    hbd.track_sandboxes(sid)
    got, _ = answers(hbd, sid)
    a = got[1][0]
    assert a["status"] == "failed" and "has no tool" in a["output"]["error"], a
    assert text_of(got[2][0]) == "grown", got[2]
    a = got[3][0]
    assert a["status"] == "done" and text_of(a) == "late: now", a
    a = got[4][0]
    assert a["status"] == "done", a
    assert text_of(a).startswith("refused:") and "no client features" in text_of(a), a
    log = open(hbd.mcp_log).read().splitlines()
    assert sorted(log) == ["ask", "late now"], log
    daemon = hbd.log(tail=None)
    assert "its tool list changed" in daemon
    refused = [line for line in daemon.splitlines() if "mcp server request refused" in line]
    assert refused and "sampling/createMessage" in refused[0] and "websse" in refused[0], refused
