"""Exactly once, seen from inside a sandbox: retries with the same seq,
50 concurrent seqs, a seq reused with other arguments, a forged identity
header; and a sandbox that belongs to no session is refused, its calls
and the tool list alike."""

import json
import os

from broker_support import add_repo

HERE = os.path.dirname(__file__)


def test_retries_and_concurrent_seqs_have_one_effect_each(bd, forge):
    files = {"hammer.py": open(os.path.join(HERE, "hammer_agent.py")).read(), "README.md": "x\n"}
    repo, _ = add_repo(bd.git_server, "hammer", files)
    before = forge.posts
    sid = bd.new_session(repo, "hammer the broker", agent={"kind": "command", "command": "python3 hammer.py"})
    s = bd.wait_state(sid, "completed", timeout=300)
    evs = bd.all_events(sid)
    line = next(e["text"] for e in evs if e["type"] == "agent_output" and e["text"].startswith("HAMMER "))
    out = json.loads(line[len("HAMMER "):])
    assert all(r["same"] and r["status"] == 200 and r["call"] == "done" for r in out["retries"]), out["retries"]
    assert out["conflict"] == [409, "seq_conflict"]
    assert out["forged"] == [200, "done"]
    assert out["concurrent"] == {"seqs": 50, "answers_per_seq": [2], "all_done": True,
                                 "one_number_per_seq": True, "distinct_numbers": 50}
    # Effects = distinct seqs: 5 + 1 + 50 pull requests, and the forge saw
    # exactly that many requests to create one.
    mine = [p for p in forge.pulls if p["_repo"] == ("acme", "hammer")]
    assert len(mine) == 56 and forge.posts - before == 56
    calls = bd.calls(sid)
    assert sorted(c["seq"] for c in calls) == [1, 2, 3, 4, 5, 6] + list(range(100, 150))
    assert {c["status"] for c in calls} == {"done"}
    # One broker_call and one broker_result event per key, whatever the retries.
    assert len([e for e in evs if e["type"] == "broker_call"]) == 56
    assert len([e for e in evs if e["type"] == "broker_result"]) == 56
    assert s["reason"] == "agent finished"
    bd.track_sandboxes(sid)


def test_sandbox_of_no_session_is_refused(bd):
    r = bd.request("POST", "/v1/sandboxes", {"template": "code-interpreter", "ttl_seconds": 300})
    assert r.status in (200, 201), r
    sbx = r.json()["id"]
    bd.created.add(sbx)
    try:
        code = ("import http.client,json;c=http.client.HTTPConnection('127.0.0.1',9200,timeout=30);"
                "c.request('POST','/v1/invoke',body=json.dumps({'seq':1,'tool':'git_push','args':{'branch':'x'}}),"
                "headers={'Content-Type':'application/json','X-Hatchery-Sandbox':'sbx_forged'});"
                "r=c.getresponse();print(r.status, r.read().decode())")
        out = bd.exec(sbx, f"python3 -c \"{code}\"")
        status, _, body = out["stdout"].strip().partition(" ")
        assert status == "403", out
        assert json.loads(body)["error"]["code"] == "unknown_sandbox"
        # The tool list too (issue 31, finding 6): the operator's MCP
        # servers are not for a sandbox of no session, and the refusal is
        # the same as a call's.
        code = ("import http.client;c=http.client.HTTPConnection('127.0.0.1',9200,timeout=30);"
                "c.request('GET','/v1/tools');r=c.getresponse();print(r.status, r.read().decode())")
        out = bd.exec(sbx, f"python3 -c \"{code}\"")
        status, _, body = out["stdout"].strip().partition(" ")
        assert status == "403", out
        assert json.loads(body)["error"]["code"] == "unknown_sandbox"
        assert "tools" not in json.loads(body)
    finally:
        assert bd.request("DELETE", f"/v1/sandboxes/{sbx}").status in (200, 204)
