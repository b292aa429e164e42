"""Policy on every broker call: first match wins, default deny, and a
session keeps the policy version it was created with (an edit after it
started changes nothing for it)."""

import json
import os

from broker_support import add_repo

HERE = os.path.dirname(__file__)

V1 = {"name": "pinning-test", "rules": [
    {"id": "no-blocked", "effect": "deny",
     "match": {"tools": ["open_pr"], "args": [{"field": "title", "op": "eq", "value": "blocked"}]}},
    {"id": "pr-ok", "effect": "allow", "match": {"tools": ["open_pr"]}},
    # Never reached for open_pr: the rule above matches first.
    {"id": "pr-review", "effect": "require_approval", "match": {"tools": ["open_pr"]}},
]}
V2 = {"name": "pinning-test", "rules": [{"id": "deny-all", "effect": "deny"}]}


def answers(d, sid):
    out = {}
    for e in d.all_events(sid):
        if e["type"] == "agent_output" and e["text"].startswith("CALL "):
            _, seq, js = e["text"].split(" ", 2)
            out[int(seq)] = json.loads(js)
    return out


def test_first_match_default_deny_and_pinning(bd, forge):
    r = bd.request("POST", "/v1/policies", V1)
    assert r.status == 201, r
    pid = r.json()["id"]
    calls = [[1, "open_pr", {"title": "blocked", "head": "{own}"}],
             [2, "open_pr", {"title": "pinned to v1", "head": "{own}"}],
             [3, "git_push", {"branch": "{own}"}]]
    files = {"agent.py": open(os.path.join(HERE, "calls_agent.py")).read(), "calls.json": json.dumps(calls)}
    repo, bare = add_repo(bd.git_server, "pinning", files)
    agent = {"kind": "command", "command": "python3 agent.py"}
    a = bd.new_session(repo, "pinned to v1", policy_id=pid, agent=agent)
    # Edited right after: session a keeps version 1, new sessions get 2.
    r = bd.request("POST", f"/v1/policies/{pid}/versions", V2)
    assert r.status == 201 and r.json()["version"] == 2, r
    b = bd.new_session(repo, "pinned to v2", policy_id=pid, agent=agent)
    bd.wait_state(a, "completed")
    bd.wait_state(b, "completed")
    created = {s: next(e for e in bd.all_events(s) if e["type"] == "session_created") for s in (a, b)}
    assert created[a]["policy_version"] == 1 and created[b]["policy_version"] == 2

    got = answers(bd, a)
    assert sorted(got) == [1, 2, 3], got
    assert (got[1]["status"], got[1]["rule_id"], got[1]["allowed"]) == ("denied", "no-blocked", False)
    assert (got[2]["status"], got[2]["rule_id"], got[2]["allowed"]) == ("done", "pr-ok", True)
    # No rule of v1 names git_push: the default deny (no rule id).
    assert got[3]["status"] == "denied" and "rule_id" not in got[3]
    assert "default deny" in got[3]["output"]["error"]
    got = answers(bd, b)
    assert [(got[s].get("status"), got[s].get("rule_id")) for s in (1, 2)] == [("denied", "deny-all")] * 2, got
    assert got[3]["rule_id"] == "deny-all"
    # Only a's allowed call had an effect.
    prs = [p["title"] for p in forge.pulls if p["_repo"] == ("acme", "pinning")]
    assert prs == ["pinned to v1"]
    for s in (a, b):
        bd.track_sandboxes(s)


def test_unknown_policy_is_refused_at_create(bd):
    r = bd.request("POST", "/v1/sessions", {"repo": "git://127.0.0.1:1/x.git", "task": "t", "policy_id": "pol_0000000000000000"})
    assert r.status == 400 and r.error_code() == "policy_not_found", r
