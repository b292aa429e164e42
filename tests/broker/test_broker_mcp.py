"""MCP fronting: the broker runs operator-configured MCP servers over
stdio and offers their tools to the agent in a real session sandbox as
`mcp.<server>.<tool>`, through the same recorded, policy-checked path as
its own tools. The git server is `mcp-server-git` from PyPI (pinned in
mcp-requirements.txt) on a repository on the host; `crashy_mcp.py` (the
real `mcp` SDK) crashes and fails on purpose. Tool annotations are the
server's word: a readOnlyHint does not get past require_approval."""

import json
import os
import shutil
import subprocess
import tempfile
import time

import pytest

from broker_support import BrokerDaemon, add_repo

HERE = os.path.dirname(__file__)
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
VENV = os.environ.get("HATCHERY_MCP_VENV", os.path.join(ROOT, "target", "mcp-venv"))

POLICY = {"name": "mcp-test", "rules": [
    {"id": "no-checkout", "effect": "deny", "match": {"tools": ["mcp.git.git_checkout"]}},
    # git_diff_unstaged says readOnlyHint: true; the policy still wants a human.
    {"id": "diff-review", "effect": "require_approval", "match": {"tools": ["mcp.git.git_diff_unstaged"]}},
    {"id": "mcp-ok", "effect": "allow", "match": {"tools": ["mcp.git.*", "mcp.crashy.*"]}},
]}


def git(*a, cwd):
    return subprocess.run(["git", *a], cwd=cwd, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def host_repo():
    d = tempfile.mkdtemp(prefix="hxmcp-repo-")
    git("init", "-q", "-b", "main", cwd=d)
    git("config", "user.email", "t@example.invalid", cwd=d)
    git("config", "user.name", "t", cwd=d)
    for i, msg in enumerate(["first commit", "second commit"]):
        with open(os.path.join(d, "f.txt"), "a") as f:
            f.write(f"line {i}\n")
        git("add", ".", cwd=d)
        git("commit", "-q", "-m", msg, cwd=d)
    with open(os.path.join(d, "f.txt"), "a") as f:
        f.write("uncommitted\n")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def procs_mentioning(s):
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if s in open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace"):
                    out.append(int(pid))
            except OSError:
                pass
    return out


@pytest.fixture
def mbd(model, git_server, push_server, forge, host_repo):
    assert os.path.exists(os.path.join(VENV, "bin", "mcp-server-git")), \
        f"no mcp-server-git in {VENV} (make broker-test installs it)"
    tmp = tempfile.mkdtemp(prefix="hxmcp-cfg-")
    crash_log = os.path.join(tmp, "crashy.log")
    cfg = os.path.join(tmp, "mcp.json")
    with open(cfg, "w") as f:
        json.dump({"servers": [
            {"name": "git", "transport": "stdio",
             "argv": [os.path.join(VENV, "bin", "mcp-server-git"), "-r", host_repo]},
            {"name": "crashy", "transport": "stdio", "call_timeout_s": 3, "max_response_bytes": 65536,
             "argv": [os.path.join(VENV, "bin", "python"), os.path.join(HERE, "crashy_mcp.py"), crash_log]},
        ]}, f)
    d = BrokerDaemon(model.port, git_server, push_server, forge, extra=["--broker-mcp-config", cfg]).start()
    d.crash_log = crash_log
    try:
        yield d
    finally:
        d.cleanup_sessions()
        # The MCP servers went with the daemon.
        deadline = time.time() + 15
        while time.time() < deadline and (procs_mentioning(host_repo) or procs_mentioning(crash_log)):
            time.sleep(0.2)
        left = procs_mentioning(host_repo) + procs_mentioning(crash_log)
        shutil.rmtree(tmp, ignore_errors=True)
        assert not left, f"MCP server processes left: {left}"


def run_agent(d, name, calls, policy_id):
    files = {"agent.py": open(os.path.join(HERE, "mcp_agent.py")).read(), "calls.json": json.dumps(calls)}
    repo, _ = add_repo(d.git_server, name, files)
    return d.new_session(repo, "use the MCP tools", policy_id=policy_id,
                         agent={"kind": "command", "command": "python3 agent.py"})


def answers(d, sid):
    out, tools = {}, None
    for e in d.all_events(sid):
        if e["type"] == "agent_output" and e["text"].startswith("CALL "):
            _, seq, js = e["text"].split(" ", 2)
            out.setdefault(int(seq), []).append(json.loads(js))
        if e["type"] == "agent_output" and e["text"].startswith("TOOLS "):
            tools = json.loads(e["text"][6:])
    return out, tools


def text_of(answer):
    return "\n".join(c.get("text", "") for c in answer["output"].get("content") or [])


def test_git_tools_policy_approval_and_one_effect_per_seq(mbd, host_repo):
    pid = mbd.request("POST", "/v1/policies", POLICY).json()["id"]
    R = host_repo
    calls = [
        [1, "mcp.git.git_status", {"repo_path": R}, {}],
        [2, "mcp.git.git_log", {"repo_path": R, "max_count": 5}, {}],
        # A visible effect, retried: one branch, the stored answer each time
        # (a second run would answer "already exists").
        [3, "mcp.git.git_create_branch", {"repo_path": R, "branch_name": "mcp-once"}, {"repeat": 3}],
        [4, "mcp.git.git_show", {"repo_path": R, "revision": "no-such-rev"}, {}],
        [5, "mcp.git.git_checkout", {"repo_path": R, "branch_name": "mcp-once"}, {}],
        [6, "mcp.git.git_nosuch", {"repo_path": R}, {}],
        [7, "mcp.nosrv.anything", {}, {}],
        [8, "mcp.git.git_diff_unstaged", {"repo_path": R}, {"wait": True}],
        [3, "mcp.git.git_create_branch", {"repo_path": R, "branch_name": "other"}, {}],
    ]
    sid = run_agent(mbd, "mcp-git", calls, pid)
    s = mbd.wait_state(sid, "waiting_approval", timeout=300)
    apr = s["pending_approval"]
    assert apr["action"] == "mcp.git.git_diff_unstaged", apr
    r = mbd.request("POST", f"/v1/sessions/{sid}/approvals/{apr['approval_id']}", {"decision": "approve", "note": "ok"})
    assert r.status == 200, r
    mbd.wait_state(sid, "completed", timeout=300)
    got, tools = answers(mbd, sid)

    # The catalog: the server's annotations are shown as data.
    t = tools["tools"]
    assert t["mcp.git.git_status"]["server"] == "git"
    assert t["mcp.git.git_diff_unstaged"]["annotations"]["readOnlyHint"] is True
    assert t["git_push"]["server"] is None
    # The crashy server's 5 KB "pre-approved" description is cut to 1 KiB.
    assert t["mcp.crashy.crash"]["description_bytes"] == 1024
    assert tools["errors"] == []

    a = got[1][0]
    assert (a["status"], a["allowed"], a["rule_id"]) == ("done", True, "mcp-ok"), a
    assert "On branch main" in text_of(a)
    assert "second commit" in text_of(got[2][0]) and "first commit" in text_of(got[2][0])
    # Three answers for seq 3, identical, one branch.
    assert len(got[3]) == 4
    assert got[3][0] == got[3][1] == got[3][2] and got[3][0]["status"] == "done", got[3]
    assert "Created branch 'mcp-once'" in text_of(got[3][0])
    assert git("branch", "--list", "mcp-once", cwd=R).strip() == "mcp-once"
    assert (got[3][3]["http"], got[3][3]["error"]["code"]) == (409, "seq_conflict")
    assert git("branch", "--list", "other", cwd=R).strip() == ""
    # isError: allowed, failed, the tool's error in the output.
    a = got[4][0]
    assert (a["status"], a["allowed"], a["output"]["is_error"]) == ("failed", True, True), a
    assert "no-such-rev" in text_of(a)
    # Denied by policy: no checkout happened.
    a = got[5][0]
    assert (a["status"], a["allowed"], a["rule_id"]) == ("denied", False, "no-checkout"), a
    assert git("rev-parse", "--abbrev-ref", "HEAD", cwd=R).strip() == "main"
    assert got[6][0]["status"] == "failed" and "has no tool" in got[6][0]["output"]["error"]
    assert (got[7][0]["http"], got[7][0]["error"]["code"]) == (400, "unknown_tool")
    # require_approval held despite readOnlyHint; after the approval it ran.
    a = got[8][-1]
    assert (a["status"], a["allowed"], a["rule_id"]) == ("done", True, "diff-review"), a
    assert "uncommitted" in text_of(a)

    calls_rec = {c["seq"]: c for c in mbd.calls(sid)}
    assert sorted(calls_rec) == [1, 2, 3, 4, 5, 6, 8]
    evs = mbd.all_events(sid)
    started = [e["call_seq"] for e in evs if e["type"] == "broker_effect_started"]
    assert started.count(3) == 1
    assert 5 not in started
    bc = [(e["call_seq"], e["tool"], e["decision"]) for e in evs if e["type"] == "broker_call"]
    assert (5, "mcp.git.git_checkout", "deny") in bc and (8, "mcp.git.git_diff_unstaged", "require_approval") in bc
    assert len(bc) == 7
    mbd.track_sandboxes(sid)


def test_crash_is_needs_review_then_resolved_and_is_error(mbd):
    pid = mbd.request("POST", "/v1/policies", POLICY).json()["id"]
    calls = [
        [1, "mcp.crashy.fail", {}, {}],
        [2, "mcp.crashy.crash", {"tag": "c1"}, {}],
        # The server comes back (after its backoff) for the next call.
        [3, "mcp.crashy.echo", {"text": "back again"}, {}],
        # Past the call timeout (3 s): killed, outcome unknown.
        [4, "mcp.crashy.hang", {"seconds": 30}, {}],
        # The response cap (64 KiB) at its boundary: under it, over it.
        [5, "mcp.crashy.big", {"n": 60000}, {}],
        [6, "mcp.crashy.big", {"n": 70000}, {}],
        [7, "mcp.crashy.echo", {"text": "still here"}, {}],
        # Asking again about the crashed call: the stored answer, no rerun.
        [2, "mcp.crashy.crash", {"tag": "c1"}, {}],
    ]
    sid = run_agent(mbd, "mcp-crash", calls, pid)
    mbd.wait_state(sid, "completed", timeout=300)
    got, _ = answers(mbd, sid)
    a = got[1][0]
    assert (a["status"], a["allowed"], a["output"]["is_error"]) == ("failed", True, True), a
    # The SDK hides the exception text; the tool name is in the error.
    assert "Error executing tool fail" in text_of(a)
    a = got[2][0]
    assert (a["status"], a["output"]["code"]) == ("needs_review", "mcp_outcome_unknown"), a
    assert got[2][1] == a
    a = got[3][0]
    assert a["status"] == "done" and text_of(a) == "back again", a
    a = got[4][0]
    assert (a["status"], a["output"]["code"]) == ("needs_review", "mcp_outcome_unknown"), a
    assert "no answer within 3 s" in a["output"]["error"]
    a = got[5][0]
    assert a["status"] == "done" and a["output"]["content"][0]["text_len"] == 60000, a["status"]
    a = got[6][0]
    assert a["status"] == "needs_review" and "more than 65536 bytes" in a["output"]["error"], a
    assert got[7][0]["status"] == "done" and text_of(got[7][0]) == "still here"
    # Started at first use, then after the crash, the timeout and the
    # oversized answer: four starts; each call ran once.
    log = open(mbd.crash_log).read().split("\n")
    assert log.count("crash c1") == 1 and log.count("hang") == 1 and log.count("start") == 4, log

    # The operator resolves the needs_review call; bad requests change nothing.
    base = f"/v1/sessions/{sid}/tool-calls"
    r = mbd.request("POST", f"{base}/2/resolve", {"outcome": "maybe", "note": "x"})
    assert r.status == 400 and r.error_code() == "invalid_request", r
    r = mbd.request("POST", f"{base}/3/resolve", {"outcome": "failed", "note": "x"})
    assert r.status == 409 and r.error_code() == "not_needs_review", r
    r = mbd.request("POST", f"{base}/99/resolve", {"outcome": "failed", "note": "x"})
    assert r.status == 404 and r.error_code() == "call_not_found", r
    r = mbd.request("POST", f"{base}/2/resolve", {"outcome": "failed", "note": "crashed before any effect"})
    assert r.status == 200, r
    v = r.json()
    assert (v["seq"], v["status"]) == (2, "failed"), v
    assert v["output"]["resolution"] == {"outcome": "failed", "note": "crashed before any effect"}
    assert v["output"]["before"]["code"] == "mcp_outcome_unknown"
    # The same resolution again is answered as before; another one is refused.
    r2 = mbd.request("POST", f"{base}/2/resolve", {"outcome": "failed", "note": "crashed before any effect"})
    assert r2.status == 200 and r2.json() == v, r2
    r = mbd.request("POST", f"{base}/2/resolve", {"outcome": "done", "note": "changed my mind"})
    assert r.status == 409 and r.error_code() == "not_needs_review", r
    evs = [e for e in mbd.all_events(sid) if e["type"] == "broker_call_resolved"]
    assert [(e["call_seq"], e["outcome"], e["note"]) for e in evs] == [(2, "failed", "crashed before any effect")]
    rec = {c["seq"]: c for c in mbd.calls(sid)}
    assert rec[5]["output"]["content"][0]["text"] == "x" * 60000
    assert {c["seq"]: c["status"] for c in mbd.calls(sid)} == {
        1: "failed", 2: "failed", 3: "done", 4: "needs_review", 5: "done", 6: "needs_review", 7: "done"}
    mbd.track_sandboxes(sid)
