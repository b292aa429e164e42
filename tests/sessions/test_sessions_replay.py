"""A diverged replay end to end (issue 37; docs/sessions.md,
"Checkpoints"): a real session (a runsc sandbox, the reference agent,
the scripted model) loses its sandbox after a checkpoint, and on the
re-run the model answers the agent's repeated step differently (the
`diverge` script's `again` turn), so the agent asks, under a message
number already executed, for another command.

Not a race: checkpoints come every CKPT s from the agent's start and the
first command sleeps 14 s, so the one checkpoint falls during it, before
message n (the second command's tool_call); the sandbox is deleted as
soon as message n is in the log, while its command sleeps, long before
the next checkpoint is due. The test reads that ordering from the log
(a checkpoint before n, none between n and the resume, the resume from
that one) instead of assuming it.

The session's pinned policy decides (docs/policy.md, `replay_diverged`):
a policy that does not name it (the default) fails the session
`replay_diverged`; `require_approval` holds the message until a person
decides: approved, the new command runs once; denied, the session fails
`replay_diverged`; `allow` runs it at once."""

import time

import pytest

from sessions_support import DEMO_FILES, SessionDaemon

CKPT = 10
FIRST = "echo first > pick.txt; sleep 120"
SECOND = "echo second > pick.txt"


@pytest.fixture
def ckpt_daemon(model):
    d = SessionDaemon(model.port, extra=["--sessions-checkpoint-interval", str(CKPT)]).start()
    yield d
    d.cleanup_sessions()


def pinned_policy(d, effect):
    """A policy whose rule for a diverged re-run says `effect`; the rest
    (model calls, ...) is allowed."""
    r = d.request("POST", "/v1/policies", {"name": f"replay-{effect}", "rules": [
        {"id": f"replay-{effect}", "match": {"tools": ["replay_diverged"]}, "effect": effect},
        {"id": "rest", "effect": "allow"},
    ]})
    assert r.status == 201, r
    return r.json()["id"]


def tool_call(d, sid, command, timeout=120):
    """The first tool_call event asking for `command`."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for e in d.all_events(sid):
            if e["type"] == "tool_call" and command in e["arguments"]:
                return e
        s = d.session(sid)
        assert s["state"] not in ("completed", "failed", "cancelled"), s
        time.sleep(0.2)
    raise AssertionError(f"no tool_call for {command!r} within {timeout} s")


def lose_after_message_n(d, git_server, name, **kw):
    """Runs the `diverge` script until message n (the first answer's
    command) is in the log, then deletes the sandbox under the session
    (what a lost host does to it). Returns the session, the lost
    sandbox and message n's event."""
    repo = git_server.add_repo(name, DEMO_FILES)
    sid = d.new_session(repo, f"[script:diverge] {name}", **kw)
    n_ev = tool_call(d, sid, FIRST)
    s = d.session(sid)
    assert s["state"] == "running", s
    lost = s["sandbox_id"]
    d.track_sandboxes(sid)
    assert d.request("DELETE", f"/v1/sandboxes/{lost}").status == 204
    return sid, lost, n_ev


def diverged(d, sid, lost, n_ev, state):
    """Waits for `state`, then checks the log: one checkpoint before
    message n and none after it, the resume from it, the re-run's
    messages up to n logged as `replayed`, matching until n, which asks
    for SECOND. Returns the events and the diverged `replayed` event."""
    s = d.wait_state(sid, state, timeout=240) if state != "failed" else wait_failed(d, sid)
    evs = d.all_events(sid)
    d.track_sandboxes(sid)
    assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1)), "gap or repeat in seqs"
    resumed = [e for e in evs if e["type"] == "resumed_from_checkpoint"]
    assert len(resumed) == 1, [e["type"] for e in evs]
    r = resumed[0]
    assert r["lost_sandbox"] == lost and r["sandbox_id"] != lost, r
    ckpts = [e for e in evs if e["type"] == "snapshot_taken" and e["purpose"] == "checkpoint"]
    before = [c for c in ckpts if c["seq"] < n_ev["seq"]]
    between = [c for c in ckpts if n_ev["seq"] < c["seq"] < r["seq"]]
    assert before and not between, ("a checkpoint before message n, none after it", ckpts, n_ev, r)
    assert r["snapshot_id"] == before[-1]["snapshot_id"], (r, before)
    replayed = [e for e in evs if e["type"] == "replayed"]
    assert replayed and all(e["n"] <= r["replay_through"] for e in replayed), (replayed, r)
    differ = [e for e in replayed if e.get("matches") is False]
    assert len(differ) == 1, replayed
    dv = differ[0]
    assert dv["kind"] == "tool_call" and SECOND in dv["asked"] and FIRST not in dv["asked"], dv
    # Everything the re-run sent before it matched (the model answered
    # the same until the step it changed).
    assert all(e.get("matches") is True for e in replayed if e["seq"] < dv["seq"]), replayed
    # The first run's command was logged once, before the loss.
    assert [e["seq"] for e in evs if e["type"] == "tool_call" and FIRST in e["arguments"]] == [n_ev["seq"]]
    return s, evs, dv


def wait_failed(d, sid, timeout=240):
    deadline = time.time() + timeout
    while time.time() < deadline:
        s = d.session(sid)
        if s["state"] in ("completed", "failed", "cancelled"):
            assert s["state"] == "failed", s
            return s
        time.sleep(0.2)
    raise AssertionError(f"session {sid} not ended after {timeout} s: {s}")


def second_runs(evs):
    return [e for e in evs if e["type"] == "command_run" and e["command"] == SECOND]


def test_a_diverged_rerun_fails_the_session_by_default(ckpt_daemon, git_server):
    d = ckpt_daemon
    sid, lost, n_ev = lose_after_message_n(d, git_server, "replay-default")
    s, evs, dv = diverged(d, sid, lost, n_ev, "failed")
    err = [e for e in evs if e["type"] == "error"]
    assert err and err[-1]["code"] == "replay_diverged" and f"agent message {dv['n']} " in err[-1]["message"], err
    assert "replay_diverged" in s["reason"], s
    # The different command never ran: no tool_call or command_run of it.
    assert second_runs(evs) == []
    assert not [e for e in evs if e["type"] == "tool_call" and SECOND in e["arguments"]], evs
    assert not [e for e in evs if e["seq"] > dv["seq"] and e["type"] in ("tool_call", "command_run")]


def test_a_diverged_rerun_waits_for_a_person_then_runs_once(ckpt_daemon, git_server):
    d = ckpt_daemon
    pid = pinned_policy(d, "require_approval")
    sid, lost, n_ev = lose_after_message_n(d, git_server, "replay-approve", policy_id=pid)
    s, evs, dv = diverged(d, sid, lost, n_ev, "waiting_approval")
    asked = [e for e in evs if e["type"] == "approval_requested" and e["seq"] > dv["seq"]]
    assert len(asked) == 1, evs
    a = asked[0]
    assert a["approval_id"].startswith("apr_replay_") and a["action"] == "replay_diverged", a
    assert SECOND in a["details"], a
    assert second_runs(evs) == [], "nothing runs before the decision"
    r = d.request("POST", f"/v1/sessions/{sid}/approvals/{a['approval_id']}", {"decision": "approve"})
    assert r.status == 200, r
    s = d.wait_state(sid, "completed", timeout=240)
    assert s["reason"] == "agent finished: picked", s
    evs = d.all_events(sid)
    d.track_sandboxes(sid)
    ran = second_runs(evs)
    assert len(ran) == 1 and ran[0]["exit_code"] == 0 and ran[0]["seq"] > a["seq"], ran
    # The next command reads what the approved one wrote.
    cat = [e for e in evs if e["type"] == "command_run" and e["command"] == "cat pick.txt"]
    assert len(cat) == 1 and cat[0]["output"].strip() == "second", cat


def test_a_diverged_rerun_a_person_denies_ends_the_session(ckpt_daemon, git_server):
    d = ckpt_daemon
    pid = pinned_policy(d, "require_approval")
    sid, lost, n_ev = lose_after_message_n(d, git_server, "replay-deny", policy_id=pid)
    s, evs, dv = diverged(d, sid, lost, n_ev, "waiting_approval")
    a = next(e for e in evs if e["type"] == "approval_requested" and e["seq"] > dv["seq"])
    r = d.request("POST", f"/v1/sessions/{sid}/approvals/{a['approval_id']}", {"decision": "deny"})
    assert r.status == 200, r
    s = wait_failed(d, sid)
    assert "replay_diverged" in s["reason"], s
    evs = d.all_events(sid)
    d.track_sandboxes(sid)
    assert second_runs(evs) == [], "denied: the new command never ran"


def test_a_diverged_rerun_the_policy_allows_runs_at_once(ckpt_daemon, git_server):
    d = ckpt_daemon
    pid = pinned_policy(d, "allow")
    sid, lost, n_ev = lose_after_message_n(d, git_server, "replay-allow", policy_id=pid)
    s, evs, dv = diverged(d, sid, lost, n_ev, "completed")
    assert s["reason"] == "agent finished: picked", s
    assert not [e for e in evs if e["type"] == "approval_requested"], evs
    ran = second_runs(evs)
    assert len(ran) == 1 and ran[0]["exit_code"] == 0 and ran[0]["seq"] > dv["seq"], ran
