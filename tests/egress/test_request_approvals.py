"""Egress approvals per request on an intercepted destination (issue 39
item 3), end to end: a real runsc session sandbox, the daemon's proxy and
approver, and an HTTPS server of the test's own in the network namespace
the suite creates (test_credentials.CredServer, on HOST; its certificate
from a test CA the daemon trusts with --egress-upstream-ca-file). A credential rule makes
the proxy end TLS for the server's two ports, so it sees each request;
`require_approval` rules on those ports then hold each request, not the
connection. The test plays the person through the decision endpoint
while the agent's commands wait:

- `GET /api/a?x=1` is held: the session `waiting_approval`, its
  `pending_approval` naming host, port, method and path (not the query),
  `scope: "request"`; nothing reached the server. Approved with
  `remember: "session"`, it goes out with the credential;
- `GET /api/a` again goes straight through, asked nothing;
- `GET /api/b` on the same host is held again (another path), denied:
  the proxy's own 403, the server sees nothing, an `egress_denied` event
  names the method, path and approval;
- on the port whose rule holds for 2 s, `GET /api/late` gets no decision:
  decided `timeout` by the system, a 403 from the proxy, an event.
The approvals are in the log before the requests they let through."""

import json
import time

import pytest

from gateway_daemon import gateway_daemon
from scripted_model import ScriptedModel
from sessions_support import DEMO_FILES
from test_credentials import PORT_BOUND, PORT_PLAIN, SECRET, SECRET_NAME, CredServer

PORT_SLOW = PORT_PLAIN


# A server of this module's own (test_credentials' is gone by now: module
# fixtures end with their module), so it logs only this module's requests.
@pytest.fixture(scope="module")
def server(testnet):
    s = CredServer(testnet)
    yield s
    s.cleanup()


def shell(cmd):
    return {"tool_calls": [{"name": "shell", "arguments": {"command": cmd}}]}


def finish(summary):
    return {"tool_calls": [{"name": "finish", "arguments": {"summary": summary}}]}


def commands(s):
    a, code = s.addr, "-w ' %{http_code}'"
    return [
        f"curl -sS {code} 'https://{a}:{PORT_BOUND}/api/a?x=1'",
        f"curl -sS {code} https://{a}:{PORT_BOUND}/api/a",
        f"curl -sS {code} https://{a}:{PORT_BOUND}/api/b",
        f"curl -sS {code} https://{a}:{PORT_SLOW}/api/late",
    ]


@pytest.fixture(scope="module")
def model(server):
    m = ScriptedModel({"perreq": [shell(c) for c in commands(server)] + [finish("asked")]}).start()
    yield m
    m.stop()


@pytest.fixture(scope="module")
def rd(model, server, agent_templates):
    with gateway_daemon(model, agent_templates, "hxreqd-", extra=["--egress-upstream-ca-file", server.ca]) as d:
        yield d


def pending(d, sid, after_ids, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        s = d.session(sid)
        p = s["pending_approval"]
        if p and p["approval_id"] not in after_ids:
            return p, s["state"]
        if s["state"] in ("completed", "failed", "cancelled"):
            raise AssertionError(f"session ended {s['state']} while waiting for an approval")
        time.sleep(0.2)
    raise AssertionError(f"no new pending approval in {timeout}s")


def decide(d, sid, aid, body):
    r = d.request("POST", f"/v1/sessions/{sid}/approvals/{aid}", body)
    assert r.status == 200, r


def test_requests_to_an_intercepted_host_are_approved_one_by_one(rd, server, git_server):
    a = server.addr
    assert rd.request("POST", "/v1/secrets", {"name": SECRET_NAME, "value": SECRET}).status == 201
    rules = [
        {"id": "ask-api", "effect": "require_approval", "approval_timeout_s": 120,
         "match": {"tools": ["egress"], "hosts": [f"{a}/32"], "ports": [PORT_BOUND]}},
        {"id": "ask-slow", "effect": "require_approval", "approval_timeout_s": 2,
         "match": {"tools": ["egress"], "hosts": [f"{a}/32"], "ports": [PORT_SLOW]}},
        {"id": "api-token", "effect": "allow",
         "match": {"tools": ["egress"], "hosts": [a], "ports": [PORT_BOUND, PORT_SLOW]},
         "credential": {"secret": SECRET_NAME, "path_prefix": "/api/",
                        "inject": {"header": {"name": "Authorization", "template": "Bearer {secret}"}}}},
    ]
    pol = rd.request("POST", "/v1/policies", {"name": "per-request", "rules": rules})
    assert pol.status == 201, pol
    repo = git_server.add_repo("perreq", dict(DEMO_FILES))
    sid = rd.new_session(repo, "[script:perreq] call the API", policy_id=pol.json()["id"],
                         template="agent-session", budget={"tokens": 200000, "wall_s": 600})

    # 1. The first request, held with its method and path.
    first, state = pending(rd, sid, set())
    assert state == "waiting_approval", state
    assert first["action"] == "egress" and first["approval_id"].startswith("apr_egress_"), first
    det = json.loads(first["details"])
    assert (det["host"], det["port"], det["method"], det["path"], det["scope"]) == (
        a, PORT_BOUND, "GET", "/api/a", "request"), det
    assert (det["rule_id"], det["timeout_s"]) == ("ask-api", 120), det
    assert "x=1" not in first["details"]
    assert server.requests() == []
    decide(rd, sid, first["approval_id"], {"decision": "approve", "remember": "session"})

    # 2. went straight through; 3. another path on the same host: held again.
    second, state = pending(rd, sid, {first["approval_id"]})
    assert state == "waiting_approval", state
    det = json.loads(second["details"])
    assert (det["port"], det["method"], det["path"], det["scope"]) == (PORT_BOUND, "GET", "/api/b", "request")
    assert [q["path"] for q in server.requests()] == ["/api/a?x=1", "/api/a"]
    decide(rd, sid, second["approval_id"], {"decision": "deny", "note": "not b"})

    # 4. Nobody answers within the rule's 2 s.
    third, _ = pending(rd, sid, {first["approval_id"], second["approval_id"]})
    det = json.loads(third["details"])
    assert (det["port"], det["method"], det["path"], det["timeout_s"]) == (PORT_SLOW, "GET", "/api/late", 2)

    rd.wait_state(sid, "completed", timeout=300)
    rd.track_sandboxes(sid)
    evs = rd.all_events(sid)
    # Whitespace folded: each answer's body, then curl's " <status>".
    out = [" ".join(e["output"].split()) for e in evs if e["type"] == "command_run"]
    assert out[0] == f"{server.addr}:{PORT_BOUND} /api/a?x=1 secret-seen 200", out
    assert out[1] == f"{server.addr}:{PORT_BOUND} /api/a secret-seen 200", out
    assert out[2] == f"GET /api/b: denied by approval {second['approval_id']}: not b 403", out
    assert out[3].startswith(f"GET /api/late: approval {third['approval_id']} not decided within 2 s"), out
    assert out[3].endswith(" 403"), out
    # The server saw the approved requests only.
    assert [(q["port"], q["path"]) for q in server.requests()] == [
        (PORT_BOUND, "/api/a?x=1"), (PORT_BOUND, "/api/a")]

    asked = [e for e in evs if e["type"] == "approval_requested"]
    assert [e["approval_id"] for e in asked] == [first["approval_id"], second["approval_id"],
                                                 third["approval_id"]], asked
    decided = {e["approval_id"]: e for e in evs if e["type"] == "approval_decided"}
    d1, d2, d3 = (decided[x["approval_id"]] for x in (first, second, third))
    assert (d1["decision"], d1.get("remember"), d1["actor"]) == ("approve", "session", "user"), d1
    assert (d2["decision"], d2["actor"]) == ("deny", "user"), d2
    assert (d3["decision"], d3["actor"]) == ("timeout", "system"), d3
    # Both approved requests carried the credential, each use recorded
    # after the approval that let it out.
    uses = [e for e in evs if e["type"] == "egress_credential"]
    assert [(u["method"], u["path"], u["port"]) for u in uses] == [
        ("GET", "/api/a", PORT_BOUND), ("GET", "/api/a", PORT_BOUND)], uses
    assert all(u["seq"] > d1["seq"] for u in uses), (uses, d1)
    # Each connection was let through (its requests held one by one).
    conns = [e for e in evs if e["type"] == "egress_connect"]
    assert len(conns) == 4 and all(c.get("approval_id") is None for c in conns), conns

    # Each refusal is an `egress_denied` naming method, path and approval.
    deadline, denied = time.time() + 15, {}
    while time.time() < deadline and len(denied) < 2:
        denied = {e["port"]: e for e in rd.all_events(sid) if e["type"] == "egress_denied"}
        time.sleep(0.3)
    assert denied[PORT_BOUND]["status"] == 403, denied
    assert denied[PORT_BOUND]["reason"].startswith(f"GET /api/b: denied by approval {second['approval_id']}")
    assert denied[PORT_SLOW]["status"] == 403, denied
    assert denied[PORT_SLOW]["reason"].startswith(f"GET /api/late: approval {third['approval_id']} not decided")
    assert not any(SECRET in json.dumps(e) for e in evs)
    assert rd.session(sid)["pending_approval"] is None
