"""Policy on every broker call: first match wins, default deny, and a
session keeps the policy version it was created with (an edit after it
started changes nothing for it)."""

import json
import os
import subprocess

from broker_support import add_repo, remote_file

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


BIG_DIFF = {"name": "diff-size-test", "rules": [
    # The docs' rule (docs/policy.md), ahead of the session's own branch.
    {"id": "big-diff", "effect": "require_approval",
     "match": {"tools": ["git_push"], "args": [{"field": "diff.lines", "op": "gt", "value": 500}]}},
    {"id": "push-session-branch", "effect": "allow",
     "match": {"tools": ["git_push"], "args": [{"field": "branch", "op": "eq", "value": {"ctx": "session_branch"}}]}},
]}


def started_diff(d, sid):
    """The diff the broker recorded in the event logged before the push."""
    evs = [e for e in d.all_events(sid) if e["type"] == "broker_effect_started"]
    assert len(evs) == 1, evs
    return json.loads(evs[0]["detail"])["diff"]


def test_push_size_is_measured_on_the_host(bd):
    """Issue 36: `diff.lines` is what the host counts in the commit it is
    about to push, not what the agent says. 800 real lines claimed as 10
    wait for the big-diff approval (the approver is shown the host's
    count) and are pushed once approved; 10 real lines are pushed at once.
    On a broker that passed the agent's `diff` through, the first push
    was allowed without an approval."""
    r = bd.request("POST", "/v1/policies", BIG_DIFF)
    assert r.status == 201, r
    pid = r.json()["id"]
    files = {"agent.py": open(os.path.join(HERE, "diff_agent.py")).read()}
    repo, bare = add_repo(bd.git_server, "diffsize", files)
    big = bd.new_session(repo, "800 lines", policy_id=pid,
                         agent={"kind": "command", "command": "python3 agent.py 800 10"})
    small = bd.new_session(repo, "10 lines", policy_id=pid,
                           agent={"kind": "command", "command": "python3 agent.py 10 10"})

    s = bd.wait_state(big, "waiting_approval")
    apr = s["pending_approval"]
    assert apr["action"] == "git_push", apr
    shown = json.loads(apr["details"])
    assert shown["diff"] == {"files": 1, "lines_added": 800, "lines_removed": 0, "lines": 800}, shown
    calls = bd.calls(big)
    assert [(c["status"], c["rule_id"]) for c in calls] == [("awaiting_approval", "big-diff")], calls
    assert calls[0]["effect"]["diff"]["lines"] == 800 and calls[0]["arguments"]["diff"]["lines"] == 10, calls
    assert subprocess.run(["git", "--git-dir", bare, "rev-parse", "--verify", "-q", f"refs/heads/hatchery/{big}"],
                          capture_output=True).returncode != 0, "pushed before the approval"
    r = bd.request("POST", f"/v1/sessions/{big}/approvals/{apr['approval_id']}", {"decision": "approve", "note": "ok"})
    assert r.status == 200, r
    bd.wait_state(big, "completed")
    bd.wait_state(small, "completed")

    got = answers(bd, big)[1]
    assert (got["status"], got["rule_id"]) == ("done", "big-diff"), got
    assert started_diff(bd, big) == {"files": 1, "lines_added": 800, "lines_removed": 0, "lines": 800}
    got = answers(bd, small)[1]
    assert (got["status"], got["rule_id"]) == ("done", "push-session-branch"), got
    assert started_diff(bd, small)["lines"] == 10
    for sid, n in ((big, 800), (small, 10)):
        text = remote_file(bare, f"hatchery/{sid}", "big.txt")
        assert text.count("\n") == n, (sid, len(text))
        bd.track_sandboxes(sid)


def test_the_standard_policy_holds_a_large_push_for_approval(bd):
    """Issue 36: pol_standard's push-large-diff rule fires on the host's
    count: a push of 800 real lines the agent claims as 10 waits for a
    person, under the session's own default policy; denied, nothing is
    pushed."""
    files = {"agent.py": open(os.path.join(HERE, "diff_agent.py")).read()}
    repo, bare = add_repo(bd.git_server, "stddiff", files)
    sid = bd.new_session(repo, "800 lines, standard policy",
                         agent={"kind": "command", "command": "python3 agent.py 800 10"})
    s = bd.wait_state(sid, "waiting_approval")
    assert s["policy_id"] == "pol_standard", s
    apr = s["pending_approval"]
    assert json.loads(apr["details"])["diff"]["lines"] == 800, apr
    calls = bd.calls(sid)
    assert [(c["status"], c["rule_id"]) for c in calls] == [("awaiting_approval", "push-large-diff")], calls
    r = bd.request("POST", f"/v1/sessions/{sid}/approvals/{apr['approval_id']}", {"decision": "deny", "note": "too big"})
    assert r.status == 200, r
    bd.wait_state(sid, "completed")
    got = answers(bd, sid)[1]
    assert (got["status"], got["rule_id"]) == ("denied", "push-large-diff"), got
    assert subprocess.run(["git", "--git-dir", bare, "rev-parse", "--verify", "-q", f"refs/heads/hatchery/{sid}"],
                          capture_output=True).returncode != 0, "a denied push was pushed"
    bd.track_sandboxes(sid)


def test_unknown_policy_is_refused_at_create(bd):
    r = bd.request("POST", "/v1/sessions", {"repo": "git://127.0.0.1:1/x.git", "task": "t", "policy_id": "pol_0000000000000000"})
    assert r.status == 400 and r.error_code() == "policy_not_found", r
