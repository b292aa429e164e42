"""Egress that waits for a person (issue 39 item 3), end to end: a real
runsc session sandbox, the daemon's proxy and its approver, and the
suite's servers (HOST, in the suite's namespace). The session's policy holds three
destinations with `require_approval`; the test plays the person through
the decision endpoint while the agent's commands wait:

- a CONNECT to the HTTPS server is held (the session `waiting_approval`,
  its `pending_approval` of action `egress` naming host and port), then
  approved with `remember: "session"`: it goes through, and the agent's
  second connection there goes straight through, asked nothing;
- a forwarded plain-HTTP request is held with its method and path (not
  its query) and denied: the agent gets 403 and the server sees nothing;
- a destination whose rule holds for 2 s gets no decision: the approval
  is decided `timeout` by the system, the agent gets 403, the server sees
  nothing;
- every decision is an `approval_decided` event before the connection's
  `egress_connect` (or its refusal);
- bad input: a hold over the cap or of 0 s, a hold on an allow rule, a
  credential on a `require_approval` rule, `remember` other than
  `session`: each 400, nothing stored or decided."""

import json
import time

import pytest

from gateway_daemon import gateway_daemon
from egress_servers import HOST
from scripted_model import ScriptedModel
from sessions_support import DEMO_FILES

CA_ENV = {"CURL_CA_BUNDLE": "/workspace/ca.pem"}


def shell(cmd):
    return {"tool_calls": [{"name": "shell", "arguments": {"command": cmd}}]}


def finish(summary):
    return {"tool_calls": [{"name": "finish", "arguments": {"summary": summary}}]}


def commands(servers):
    p, h, d = servers.https.port, servers.http.port, servers.denied.port
    return [
        f"curl -sS https://{HOST}:{p}/hello",
        f"curl -sS https://{HOST}:{p}/hello",
        f"curl -sS -o /dev/null -w '%{{http_code}}' 'http://{HOST}:{h}/plain?tok=1'",
        f"curl -sS -o /dev/null -w '%{{http_code}}' http://{HOST}:{d}/late",
    ]


@pytest.fixture(scope="module")
def model(servers):
    m = ScriptedModel({"approvals": [shell(c) for c in commands(servers)] + [finish("asked")]}).start()
    yield m
    m.stop()


@pytest.fixture(scope="module")
def ad(model, agent_templates):
    with gateway_daemon(model, agent_templates, "hxappr-") as d:
        yield d


def ask(rule_id, port, timeout_s):
    return {"id": rule_id, "effect": "require_approval", "approval_timeout_s": timeout_s,
            "match": {"tools": ["egress"], "hosts": [f"{HOST}/32"], "ports": [port]}}


def pending(d, sid, after_ids, timeout=120):
    """The session's pending approval once it is a new one (not in
    `after_ids`), and the session's state then."""
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
    return d.request("POST", f"/v1/sessions/{sid}/approvals/{aid}", body)


def test_held_connections_wait_for_a_person(ad, servers, git_server):
    p, h, dport = servers.https.port, servers.http.port, servers.denied.port
    pol = ad.request("POST", "/v1/policies", {"name": "approvals", "rules": [
        ask("ask-https", p, 120), ask("ask-plain", h, 120), ask("ask-slow", dport, 2)]})
    assert pol.status == 201, pol
    repo = git_server.add_repo("approvals", {**DEMO_FILES, "ca.pem": servers.ca_pem})
    sid = ad.new_session(repo, "[script:approvals] reach out", policy_id=pol.json()["id"],
                         template="agent-session", env=CA_ENV, budget={"tokens": 200000, "wall_s": 600})

    # 1. The CONNECT, held: host and port only.
    first, state = pending(ad, sid, set())
    assert state == "waiting_approval", state
    assert first["action"] == "egress" and first["approval_id"].startswith("apr_egress_"), first
    det = json.loads(first["details"])
    assert (det["host"], det["port"], det["method"], det["path"]) == (HOST, p, None, None), det
    assert (det["rule_id"], det["timeout_s"]) == ("ask-https", 120), det
    assert servers.hits["https"] == []
    # Bad decisions change nothing.
    r = decide(ad, sid, first["approval_id"], {"decision": "approve", "remember": "forever"})
    assert r.status == 400 and "remember" in r.json()["error"]["message"], r
    r = decide(ad, sid, first["approval_id"], {"decision": "maybe"})
    assert r.status == 400, r
    assert ad.session(sid)["pending_approval"]["approval_id"] == first["approval_id"]
    r = decide(ad, sid, first["approval_id"], {"decision": "approve", "remember": "session", "note": "ok once"})
    assert r.status == 200, r

    # 3. (2 went straight through) The forwarded request, held with its
    # method and path, denied.
    second, state = pending(ad, sid, {first["approval_id"]})
    assert state == "waiting_approval", state
    det = json.loads(second["details"])
    assert (det["host"], det["port"], det["method"], det["path"]) == (HOST, h, "GET", "/plain"), det
    assert "tok" not in second["details"]
    r = decide(ad, sid, second["approval_id"], {"decision": "deny", "note": "not this one"})
    assert r.status == 200, r

    # 4. Nobody answers: the system decides `timeout` after 2 s.
    third, _ = pending(ad, sid, {first["approval_id"], second["approval_id"]})
    assert json.loads(third["details"])["timeout_s"] == 2

    ad.wait_state(sid, "completed", timeout=300)
    ad.track_sandboxes(sid)
    evs = ad.all_events(sid)
    out = [e["output"].strip() for e in evs if e["type"] == "command_run"]
    assert out == ["hello through the proxy", "hello through the proxy", "403", "403"], out

    asked = [e for e in evs if e["type"] == "approval_requested"]
    assert [e["approval_id"] for e in asked] == [first["approval_id"], second["approval_id"],
                                                 third["approval_id"]], asked
    decided = {e["approval_id"]: e for e in evs if e["type"] == "approval_decided"}
    d1, d2, d3 = (decided[x["approval_id"]] for x in (first, second, third))
    assert (d1["decision"], d1.get("remember"), d1["actor"]) == ("approve", "session", "user"), d1
    assert (d2["decision"], d2.get("remember"), d2["actor"]) == ("deny", None, "user"), d2
    assert (d3["decision"], d3["actor"]) == ("timeout", "system") and "2 s" in d3["note"], d3

    # Both HTTPS connections name the approval; the decision came first.
    conns = [e for e in evs if e["type"] == "egress_connect" and e["port"] == p]
    assert len(conns) == 2 and all(c["approval_id"] == first["approval_id"] for c in conns), conns
    assert all(c["rule_id"] == "ask-https" and c["seq"] > d1["seq"] for c in conns)
    assert not any(e["type"] == "egress_connect" and e["port"] in (h, dport) for e in evs)
    assert [path for _, path in servers.hits["https"]] == ["/hello", "/hello"]
    assert servers.hits["http"] == [] and servers.hits["denied"] == []

    # Each refusal is counted in an `egress_denied` naming its approval.
    deadline, denied = time.time() + 15, {}
    while time.time() < deadline and len(denied) < 2:
        denied = {e["port"]: e for e in ad.all_events(sid) if e["type"] == "egress_denied"}
        time.sleep(0.3)
    assert denied[h]["status"] == 403 and second["approval_id"] in denied[h]["reason"], denied
    assert denied[dport]["status"] == 403 and third["approval_id"] in denied[dport]["reason"], denied
    assert ad.session(sid)["pending_approval"] is None


def test_bad_holds_are_refused(ad, servers):
    p = servers.https.port
    cred = {"secret": "NONE", "inject": {"query": {"param": "t"}}}
    for rule, needle in [
        (ask("r", p, 901), "approval_timeout_s 901: must be 1–900"),
        (ask("r", p, 0), "approval_timeout_s 0: must be 1–900"),
        ({**ask("r", p, 30), "effect": "allow"}, "only a require_approval rule holds"),
        ({**ask("r", p, 30), "credential": cred}, "only an allow rule may carry a credential"),
    ]:
        r = ad.request("POST", "/v1/policies", {"name": "bad-hold", "rules": [rule]})
        assert r.status == 400 and needle in r.json()["error"]["message"], (rule, r)
    assert not any(x["name"] == "bad-hold" for x in ad.request("GET", "/v1/policies").json()["policies"])
