"""Model calls that wait for a person (issue 36 item 4), end to end: a
real runsc session sandbox whose reference agent calls the scripted model
through the daemon's gateway, and a pinned policy whose rule says
`require_approval` for `model_call`. The test plays the person through
the decision endpoint while the agent's call is held:

- approved with `remember: "session"`: the session showed
  `waiting_approval` with a `pending_approval` of action `model_call`
  naming the model, the estimated tokens and cents and the rule; the call
  then goes out (its intent after the decision) and the agent's second
  call, which the same rule decides, goes straight through, asked nothing;
- denied: the call is refused 403 `policy_denied` (a `model_refused`
  event), the upstream never sees it, nothing is spent;
- no decision within the rule's 2 s: the system decides `timeout`, the
  call is refused 403 `approval_timeout`; both events are in the
  session's verified hash chain.

The gateway never holds a reservation while a call waits."""

import json
import time

import pytest

from gateway_daemon import gateway_daemon, verify_chain
from scripted_model import ScriptedModel
from sessions_support import DEMO_FILES

PRICES = {"models": {"scripted": {"input_cents_per_mtok": 100000, "output_cents_per_mtok": 400000}}}
BUDGET = {"tokens": 200000, "wall_s": 600}


def shell(cmd):
    return {"tool_calls": [{"name": "shell", "arguments": {"command": cmd}}]}


def finish(summary):
    return {"tool_calls": [{"name": "finish", "arguments": {"summary": summary}}]}


@pytest.fixture(scope="module")
def model():
    m = ScriptedModel({
        "mc-remember": [shell("echo asked once"), finish("two calls, one question")],
        "mc-refused": [finish("never reached")],
    }).start()
    yield m
    m.stop()


@pytest.fixture(scope="module")
def md(model, agent_templates):
    with gateway_daemon(model, agent_templates, "hxmcap-", prices=PRICES) as d:
        yield d


def policy(d, timeout_s):
    r = d.request("POST", "/v1/policies", {"name": "ask-before-models", "rules": [
        {"id": "ask-model-call", "effect": "require_approval", "approval_timeout_s": timeout_s,
         "match": {"tools": ["model_call"]}},
        {"id": "rest", "effect": "allow"}]})
    assert r.status == 201, r
    return r.json()["id"]


def pending(d, sid, timeout=180):
    deadline = time.time() + timeout
    while time.time() < deadline:
        s = d.session(sid)
        if s["pending_approval"]:
            return s["pending_approval"], s
        if s["state"] in ("completed", "failed", "cancelled"):
            raise AssertionError(f"session ended {s['state']} while waiting for an approval: {s}")
        time.sleep(0.2)
    raise AssertionError(f"no pending approval in {timeout}s")


def ended(d, sid, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        s = d.session(sid)
        if s["state"] in ("completed", "failed", "cancelled"):
            d.track_sandboxes(sid)
            return s
        time.sleep(0.3)
    raise AssertionError(f"session {sid} did not end in {timeout}s")


def decide(d, sid, aid, body):
    return d.request("POST", f"/v1/sessions/{sid}/approvals/{aid}", body)


def check_held(p, s):
    assert s["state"] == "waiting_approval", s
    assert p["action"] == "model_call" and p["approval_id"].startswith("apr_model_"), p
    det = json.loads(p["details"])
    assert (det["model"], det["rule_id"], det["timeout_s"]) == ("scripted", "ask-model-call",
                                                                det["timeout_s"]), det
    assert det["tokens"] > 0 and det["usd_cents"] > 0, det
    return det


def test_approved_with_remember_then_the_next_call_goes_straight_through(md, model, git_server):
    repo = git_server.add_repo("mc-remember", DEMO_FILES)
    before = len(model.requests)
    sid = md.new_session(repo, "[script:mc-remember] two calls", policy_id=policy(md, 120),
                         template="agent-session", budget=BUDGET)
    p, s = pending(md, sid)
    det = check_held(p, s)
    assert det["timeout_s"] == 120
    # Held: the upstream has not seen it and nothing is reserved.
    time.sleep(1)
    assert len(model.requests) == before
    assert s["spend"]["tokens"] == 0, s
    r = decide(md, sid, p["approval_id"], {"decision": "approve", "remember": "session"})
    assert r.status == 200, r
    s = md.wait_state(sid, "completed", timeout=300)
    md.track_sandboxes(sid)
    assert s["reason"] == "agent finished: two calls, one question", s
    evs = md.all_events(sid)
    asked = [e for e in evs if e["type"] == "approval_requested"]
    assert [e["approval_id"] for e in asked] == [p["approval_id"]], asked
    decided = [e for e in evs if e["type"] == "approval_decided"]
    assert [(e["decision"], e.get("remember"), e["actor"]) for e in decided] == [
        ("approve", "session", "user")], decided
    intents = [e for e in evs if e["type"] == "model_call_intent"]
    calls = [e for e in evs if e["type"] == "model_call"]
    assert len(intents) == len(calls) == 2, evs
    assert all(i["seq"] > decided[0]["seq"] for i in intents), (intents, decided)
    assert intents[0]["reserved_tokens"] == det["tokens"], (intents, det)
    assert len(model.requests) - before == 2
    assert s["spend"]["tokens"] == sum(c["tokens"] for c in calls) > 0
    assert s["pending_approval"] is None
    verify_chain(md, sid)


def refused_call(md, model, git_server, name, timeout_s, body):
    repo = git_server.add_repo(name, DEMO_FILES)
    before = len(model.requests)
    sid = md.new_session(repo, "[script:mc-refused] one call", policy_id=policy(md, timeout_s),
                         template="agent-session", budget=BUDGET)
    p, s = pending(md, sid)
    check_held(p, s)
    if body is not None:
        assert decide(md, sid, p["approval_id"], body).status == 200
    s = ended(md, sid)
    evs = md.all_events(sid)
    decided = [e for e in evs if e["type"] == "approval_decided" and e["approval_id"] == p["approval_id"]]
    refused = [e for e in evs if e["type"] == "model_refused"]
    assert len(decided) == 1 and refused, evs
    assert refused[0]["seq"] > decided[0]["seq"], (decided, refused)
    assert not any(e["type"] in ("model_call", "model_call_intent") for e in evs), evs
    assert s["spend"]["tokens"] == 0, s
    assert len(model.requests) == before, "the upstream saw a call nobody approved"
    report = verify_chain(md, sid)
    assert report["head"]["seq"] >= refused[0]["seq"], report
    return decided[0], refused[0]


def test_denied_is_refused_as_the_policy_denying_it(md, model, git_server):
    d, r = refused_call(md, model, git_server, "mc-deny", 120, {"decision": "deny", "note": "too dear"})
    assert (d["decision"], d["actor"]) == ("deny", "user"), d
    assert r["code"] == "policy_denied" and "ask-model-call" in r["message"], r


def test_no_decision_in_time_is_refused_with_a_timeout_in_the_log(md, model, git_server):
    d, r = refused_call(md, model, git_server, "mc-timeout", 2, None)
    assert (d["decision"], d["actor"]) == ("timeout", "system") and "2 s" in d["note"], d
    assert r["code"] == "approval_timeout" and d["approval_id"] in r["message"], r
