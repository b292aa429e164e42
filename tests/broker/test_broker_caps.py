"""Per-session caps on broker calls against a real daemon (docs/sessions.md,
"Caps"; docs/threat-model.md, "3. What a session can store"): past
`--broker-session-max-calls` a new call is 429 `session_call_cap` before
anything of it is recorded, the refusal is one `output_capped` event however
often the agent asks again, and the session's view shows what it holds."""

import json
import os

from broker_support import BrokerDaemon, add_repo
from harness import metric

HERE = os.path.dirname(__file__)
CAP = 3
DENY_ALL = {"name": "caps-test", "rules": [{"id": "deny-all", "effect": "deny"}]}


def test_calls_past_the_session_cap_are_429_and_leave_no_record(model, git_server, push_server, forge):
    d = BrokerDaemon(model.port, git_server, push_server, forge,
                     extra=["--broker-session-max-calls", str(CAP)]).start()
    try:
        r = d.request("POST", "/v1/policies", DENY_ALL)
        assert r.status == 201, r
        # Calls 1..3 fill the cap (each denied by the policy, so no effect
        # anywhere), 4..6 are past it; 2 again is a retry of a recorded call
        # (same seq, same arguments), which the cap must not refuse.
        calls = [[s, "open_pr", {"title": f"t{s}", "head": "{own}"}] for s in range(1, 7)]
        calls.append([2, "open_pr", {"title": "t2", "head": "{own}"}])
        files = {"agent.py": open(os.path.join(HERE, "calls_agent.py")).read(), "calls.json": json.dumps(calls)}
        repo, _ = add_repo(git_server, "caps", files)
        sid = d.new_session(repo, "many calls", policy_id=r.json()["id"],
                            agent={"kind": "command", "command": "python3 agent.py"})
        s = d.wait_state(sid, ("completed", "failed"), timeout=300)
        d.track_sandboxes(sid)
        assert s["state"] == "completed", s
        evs = d.all_events(sid)
        # The agent prints each answer, in order (seq 2 twice).
        lines = [json.loads(e["text"].split(" ", 2)[2]) for e in evs
                 if e["type"] == "agent_output" and e["text"].startswith("CALL ")]
        assert len(lines) == 7, lines
        for got in lines[:3]:
            assert (got["http"], got["status"], got["rule_id"]) == (200, "denied", "deny-all"), got
        for got in lines[3:6]:
            assert got["http"] == 429 and got["error"]["code"] == "session_call_cap", got
        assert lines[6]["http"] == 200 and lines[6]["status"] == "denied", lines[6]
        # One marker for the cap, not one per refusal.
        capped = [e for e in evs if e["type"] == "output_capped"]
        assert [(e["cap"], e["limit"]) for e in capped] == [("session_call_cap", CAP)], capped
        # Nothing of a refused call is in the log or the record.
        called = sorted(e["call_seq"] for e in evs if e["type"] == "broker_call")
        assert called == [1, 2, 3], called
        st = d.session(sid)["storage"]
        assert st["broker_calls"] == CAP, st
        assert "session_call_cap" in st["caps_reached"], st
        assert metric(d, "hatchery_broker_session_caps_hit_total", 'cap="session_call_cap"') == 3
        assert not [p for p in forge.pulls if p["_repo"] == ("acme", "caps")]
    finally:
        d.cleanup_sessions()
