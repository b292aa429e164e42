"""Credentials at the egress for real tools (issue 39): from inside a runsc
session sandbox, `pip install` from a private index and `git clone` over
HTTPS from a private server both need a token (the suite's HTTPS server on
HOST, in the suite's namespace, answers 401 under `/private/` without it). A credential rule
binds the stored token to that server's `/private/` paths; the proxy
intercepts (the sandbox trusts the deployment's CA through the variables
the runner sets) and adds it. Both succeed, each request the server took
under `/private/` carried the token, each use is an `egress_credential`
event within the session's hash chain (`hatchery audit verify`), and a
scan of the sandbox (every process's environ and cmdline, readable files)
finds no byte run of the token. test_credentials.py
covers curl, redirects, other paths and ports, and bad input."""

import json

import pytest

from gateway_daemon import gateway_daemon, verify_chain
from egress_servers import HOST, PKG, PKG_VALUE
from scripted_model import ScriptedModel
from sessions_support import DEMO_FILES
from test_credentials import SCAN



def shell(cmd):
    return {"tool_calls": [{"name": "shell", "arguments": {"command": cmd}}]}


def finish(summary):
    return {"tool_calls": [{"name": "finish", "arguments": {"summary": summary}}]}


def commands(servers):
    p = servers.https.port
    return [
        (f"pip install -q --no-deps --break-system-packages --target /tmp/pkgs "
         f"--index-url https://{HOST}:{p}/private/simple/ {PKG} 2>&1 && "
         f"python3 -c 'import sys; sys.path.insert(0, \"/tmp/pkgs\"); import {PKG}; print({PKG}.VALUE)'"),
        f"git clone -q https://{HOST}:{p}/private/git/lib.git /tmp/lib 2>&1 && cat /tmp/lib/hello.txt",
        f"python3 /workspace/scan.py {servers.token.encode().hex()}",
    ]


@pytest.fixture(scope="module")
def model(servers):
    m = ScriptedModel({"tools": [shell(c) for c in commands(servers)] + [finish("installed")]}).start()
    yield m
    m.stop()


@pytest.fixture(scope="module")
def td(model, servers, agent_templates):
    with gateway_daemon(model, agent_templates, "hxctools-", extra=["--egress-upstream-ca-file", servers.ca]) as d:
        yield d


def test_pip_and_git_get_the_token_only_at_the_proxy(td, servers, git_server):
    r = td.request("POST", "/v1/secrets", {"name": "INDEX_TOKEN", "value": servers.token})
    assert r.status == 201, r
    p = servers.https.port
    pol = td.request("POST", "/v1/policies", {"name": "private-index", "rules": [
        {"id": "private", "effect": "allow",
         "match": {"tools": ["egress"], "hosts": [HOST], "ports": [p]},
         "credential": {"secret": "INDEX_TOKEN", "methods": ["GET", "POST"], "path_prefix": "/private/",
                        "inject": {"header": {"name": "Authorization", "template": "Bearer {secret}"}}}}]})
    assert pol.status == 201, pol
    repo = git_server.add_repo("tools", {**DEMO_FILES, "scan.py": SCAN})
    # No CA variables of the session's own: the runner points every tool
    # at the deployment's CA.
    sid = td.new_session(repo, "[script:tools] install and clone", policy_id=pol.json()["id"],
                         template="agent-session", budget={"tokens": 200000, "wall_s": 600})
    td.wait_state(sid, "completed", timeout=300)
    td.track_sandboxes(sid)
    evs = td.all_events(sid)
    out = [e["output"].strip() for e in evs if e["type"] == "command_run"]
    assert out[0].endswith(PKG_VALUE), out[0]
    assert out[1] == "cloned over https", out[1]
    assert out[2].startswith("clean ") and int(out[2].split()[1]) > 1000, out[2]

    # Every private request carried the token; pip fetched the page and the
    # wheel, git its refs and the pack.
    seen = servers.private
    assert seen and all(ok for _, _, ok in seen), seen
    paths = {path for _, path in [(m, q) for m, q, _ in seen]}
    assert f"/private/simple/{PKG}/" in paths and any(q.startswith("/private/packages/") for q in paths), paths
    assert "/private/git/lib.git/info/refs" in paths and ("POST", "/private/git/lib.git/git-upload-pack") in \
        {(m, q) for m, q, _ in seen}, seen
    uses = [e for e in evs if e["type"] == "egress_credential"]
    assert len(uses) == len(seen) and all(u["secret"] == "INDEX_TOKEN" for u in uses), (uses, seen)
    assert not any(servers.token in json.dumps(e) for e in evs)
    # Each use is in the session's verified hash chain.
    report = verify_chain(td, sid)
    assert report["head"]["seq"] >= max(u["seq"] for u in uses), (report, uses)
