"""Sessions end to end with real runsc sandboxes: a repository from a real
git server, the reference agent talking to the scripted model through the
host-services relay, steering, approvals, cancel, idle snapshot and
resume, and a daemon SIGKILL mid-session. Every test checks teardown."""

import json
import time

from sessions_support import DEMO_FILES, SessionDaemon, sse_events


def types(evs):
    return [e["type"] for e in evs]


def assert_log_sound(evs):
    assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1)), "gap or repeat in seqs"
    for e in evs:
        assert e["actor"] in ("user", "agent", "system") and e["at"].endswith("Z")


def test_agent_fixes_failing_test(sd, git_server, model):
    repo = git_server.add_repo("calc", DEMO_FILES)
    sid = sd.new_session(repo, "[script:fix] The test in test_calc.py fails. Make it pass.",
                         budget={"tokens": 100000, "wall_s": 600})
    # A reader that drops the connection every few events and reconnects
    # with Last-Event-ID (or `after`) must see every event exactly once.
    seen, last, flip = [], 0, False
    while True:
        chunk = sse_events(sd.port, sid, **({"after": last} if flip else {"last_event_id": last}), stop_after=4)
        flip = not flip
        seen += chunk
        if chunk:
            last = chunk[-1][0]
        if chunk and chunk[-1][2]["type"] == "state_changed" and chunk[-1][2]["to"] in ("completed", "failed", "cancelled"):
            break
    s = sd.session(sid)
    assert s["state"] == "completed", s["reason"]
    assert s["reason"] == "agent finished: fixed add(); tests pass"
    assert s["spend"]["tokens"] > 0 and s["sandbox_id"] is None
    sd.track_sandboxes(sid)
    evs = sd.all_events(sid)
    assert_log_sound(evs)
    assert [g[0] for g in seen] == [e["seq"] for e in evs]
    assert [g[2] for g in seen] == evs
    t = types(evs)
    # The steps, in order: checkout, read, failing run, edit, passing run, done.
    order = ["repo_fetch_started", "repo_checked_out", "agent_started", "tool_result", "command_run",
             "file_changed", "command_run", "agent_done", "agent_exited", "workspace_diff", "sandbox_released"]
    pos = 0
    for want in order:
        pos = t.index(want, pos) + 1
    runs = [e for e in evs if e["type"] == "command_run"]
    assert runs[0]["exit_code"] != 0 and "FAIL" in runs[0]["output"]
    assert runs[1]["exit_code"] == 0 and " ok" in runs[1]["output"]
    # Each tool call is logged before its effect (the agent waits for the ack).
    for r in runs:
        call = next(e for e in evs if e["type"] == "tool_call" and e["call_id"] == r["call_id"] and e["seq"] < r["seq"])
        assert call["tool"] == "shell"
    diff = next(e for e in evs if e["type"] == "workspace_diff")
    assert "-    return a - b" in diff["patch"] and "+    return a + b" in diff["patch"]
    assert [e["to"] for e in evs if e["type"] == "state_changed"] == ["starting", "running", "completed"]
    # The agent reached the model only through the relay, from its sandbox.
    sbx = next(e["sandbox_id"] for e in evs if e["type"] == "sandbox_ready")
    assert any(r["sandbox"] == sbx for r in model.requests)


def test_steering_message_and_approval(sd, git_server):
    repo = git_server.add_repo("steer", DEMO_FILES)
    sid = sd.new_session(repo, "[script:ask] write the answer")
    sd.wait_event(sid, "waiting")
    assert sd.session(sid)["waiting"] == "message"
    r = sd.request("POST", f"/v1/sessions/{sid}/messages", {"text": "notes.md"})
    assert r.status == 202, r
    mseq = r.json()["seq"]
    s = sd.wait_state(sid, "completed")
    assert s["reason"] == "agent finished: wrote notes.md"
    evs = sd.all_events(sid)
    assert_log_sound(evs)
    msg = next(e for e in evs if e["type"] == "message")
    assert msg["seq"] == mseq and msg["actor"] == "user" and msg["text"] == "notes.md"
    delivered = next(e for e in evs if e["type"] == "message_delivered")
    assert delivered["message_seq"] == mseq and delivered["seq"] > mseq
    cat = next(e for e in evs if e["type"] == "command_run" and e["command"] == "cat answer.txt")
    assert cat["output"] == "notes.md"
    sd.track_sandboxes(sid)

    sid = sd.new_session(repo, "[script:approve] push it")
    s = sd.wait_state(sid, "waiting_approval")
    aid = s["pending_approval"]["approval_id"]
    assert s["pending_approval"]["action"] == "git_push"
    assert sd.request("POST", f"/v1/sessions/{sid}/approvals/apr_aaaaaaaaaaaaaaaa", {"decision": "approve"}).status == 404
    assert sd.request("POST", f"/v1/sessions/{sid}/approvals/{aid}", {"decision": "maybe"}).status == 400
    r = sd.request("POST", f"/v1/sessions/{sid}/approvals/{aid}", {"decision": "approve", "note": "ok"})
    assert r.status == 200, r
    assert sd.request("POST", f"/v1/sessions/{sid}/approvals/{aid}", {"decision": "deny"}).status == 404
    s = sd.wait_state(sid, "completed")
    evs = sd.all_events(sid)
    assert_log_sound(evs)
    t = types(evs)
    assert t.index("approval_requested") < t.index("approval_decided") < t.index("command_run")
    assert [e["to"] for e in evs if e["type"] == "state_changed"] == [
        "starting", "running", "waiting_approval", "running", "completed"]
    sd.track_sandboxes(sid)


def test_steer_then_cancel_mid_run(sd, git_server):
    repo = git_server.add_repo("slow", DEMO_FILES)
    sid = sd.new_session(repo, "[script:steer] take your time")
    sd.wait_event(sid, "tool_call")
    # Delivered while the agent is busy: it reads it before its next step.
    r = sd.request("POST", f"/v1/sessions/{sid}/messages", {"text": "steered"})
    assert r.status == 202
    sd.wait_event(sid, "message_delivered")
    steer = None
    deadline = time.time() + 120
    while steer is None and time.time() < deadline:
        steer = next((e for e in sd.all_events(sid) if e["type"] == "command_run" and "steer.txt" in e["command"]), None)
        time.sleep(0.2)
    assert steer is not None and "steered" in steer["command"]
    sd.wait_event(sid, "tool_call", after=steer["seq"])
    # Now cancel: the agent is stopped, a review snapshot kept, cancelled.
    c = sd.request("POST", f"/v1/sessions/{sid}:cancel")
    assert c.status == 200, c
    s = c.json()
    # The agent is inside `sleep 120` (the "steer" script): it cannot have
    # finished, so anything but cancelled is a failure, never a pass.
    assert s["state"] == "cancelled", s
    assert s["review_snapshot_id"], s
    assert sd.request("GET", f"/v1/snapshots/{s['review_snapshot_id']}").status == 200
    again = sd.request("POST", f"/v1/sessions/{sid}:cancel")
    assert again.status == 200 and again.json()["state"] == "cancelled"
    assert sd.request("POST", f"/v1/sessions/{sid}/messages", {"text": "late"}).status == 409
    evs = sd.all_events(sid)
    assert_log_sound(evs)
    t = types(evs)
    # (A checkpoint, on by default, may have been taken before the cancel.)
    ci = t.index("cancel_requested")
    assert ci < t.index("snapshot_started", ci) < t.index("snapshot_taken", ci) < t.index("sandbox_released", ci)
    assert evs[-1]["type"] == "state_changed" and evs[-1]["to"] == "cancelled"
    sd.track_sandboxes(sid)
    sbx = next(e["sandbox_id"] for e in evs if e["type"] == "sandbox_ready")
    assert sd.request("GET", f"/v1/sandboxes/{sbx}").status == 404


def test_cancel_right_after_create(sd, git_server):
    repo = git_server.add_repo("quick", DEMO_FILES)
    sid = sd.new_session(repo, "[script:slow] t")
    c = sd.request("POST", f"/v1/sessions/{sid}:cancel")
    assert c.status == 200 and c.json()["state"] == "cancelled", c
    sd.track_sandboxes(sid)
    assert_log_sound(sd.all_events(sid))


def test_idle_snapshot_and_resume(model, git_server):
    d = SessionDaemon(model.port, extra=["--sessions-idle-timeout", "2"]).start()
    try:
        repo = git_server.add_repo("idle", DEMO_FILES)
        sid = d.new_session(repo, "[script:ask] write the answer")
        s = d.wait_state(sid, "idle")
        assert s["snapshot_id"] and s["sandbox_id"] is None and s["waiting"] == "message"
        idle_snapshot = s["snapshot_id"]
        # It is there while the session is idle (so the 404 below is the
        # deletion, not a wrong id).
        assert d.request("GET", f"/v1/snapshots/{idle_snapshot}").status == 200
        d.track_sandboxes(sid)
        evs = d.all_events(sid)
        first_sbx = next(e["sandbox_id"] for e in evs if e["type"] == "sandbox_ready")
        assert d.request("GET", f"/v1/sandboxes/{first_sbx}").status == 404
        r = d.request("POST", f"/v1/sessions/{sid}/messages", {"text": "resumed.md"})
        assert r.status == 202
        s = d.wait_state(sid, "completed")
        assert s["reason"] == "agent finished: wrote resumed.md"
        evs = d.all_events(sid)
        assert_log_sound(evs)
        resumed = next(e for e in evs if e["type"] == "resumed")
        assert resumed["resume_ms"] > 0 and resumed["sandbox_id"] != first_sbx
        assert [e["to"] for e in evs if e["type"] == "state_changed"] == [
            "starting", "running", "idle", "running", "completed"]
        cat = next(e for e in evs if e["type"] == "command_run" and e["command"] == "cat answer.txt")
        assert cat["output"] == "resumed.md"
        d.track_sandboxes(sid)
        # The idle snapshot is deleted once resumed.
        assert d.request("GET", f"/v1/snapshots/{idle_snapshot}").status == 404
    finally:
        d.cleanup_sessions()


def test_daemon_sigkill_mid_session(model, git_server):
    d = SessionDaemon(model.port).start()
    d2 = None
    try:
        repo = git_server.add_repo("crash", DEMO_FILES)
        sid = d.new_session(repo, "[script:slow] survive a crash")
        d.wait_event(sid, "tool_call")
        before = d.all_events(sid)
        d.track_sandboxes(sid)
        d.crash()
        # Same data dir, same network prefix and range: the sandboxes are
        # re-adopted and the session's runner re-attaches to its agent.
        d2 = SessionDaemon(model.port, data_dir=d.data_dir)
        d2.extra_args = d.extra_args
        d2.net_prefix = d.net_prefix
        d2.created = d.created
        d2.start()
        s = d2.wait_state(sid, "completed", timeout=300)
        evs = d2.all_events(sid)
        assert_log_sound(evs)
        # Nothing acknowledged before the crash was lost or changed.
        assert evs[:len(before)] == before
        steps = [e["step"] for e in evs if e["type"] == "model_request"]
        assert steps == sorted(set(steps)), steps
        calls = [(e["call_id"], e["command"]) for e in evs if e["type"] == "command_run"]
        assert len(calls) == len(set(calls)) == 3, calls
        assert s["reason"] == "agent finished: done slowly"
    finally:
        if d2 is not None:
            d2.cleanup_sessions()
        else:
            d.cleanup_sessions()


def test_lost_sandbox_resumes_from_checkpoint(model, git_server):
    """Checkpoints every 2 s; the agent's sandbox is deleted under it
    mid-run (what a lost host does to it): the session forks its last
    checkpoint, the agent runs on from there, and what it had done before
    is neither lost nor logged twice."""
    d = SessionDaemon(model.port, extra=["--sessions-checkpoint-interval", "2"]).start()
    try:
        repo = git_server.add_repo("ckpt", DEMO_FILES)
        sid = d.new_session(repo, "[script:slow] survive losing the sandbox")
        ckpt = d.wait_event(sid, "snapshot_taken")
        assert ckpt["purpose"] == "checkpoint"
        first = d.wait_event(sid, "command_run", timeout=120)
        assert first["command"] == "sleep 4; echo one"
        s = d.session(sid)
        assert s["state"] == "running" and s["snapshot_id"], s
        lost = s["sandbox_id"]
        before = d.all_events(sid)
        d.track_sandboxes(sid)
        assert d.request("DELETE", f"/v1/sandboxes/{lost}").status == 204
        s = d.wait_state(sid, "completed", timeout=240)
        assert s["reason"] == "agent finished: done slowly", s
        evs = d.all_events(sid)
        d.track_sandboxes(sid)
        assert_log_sound(evs)
        assert evs[:len(before)] == before
        resumed = [e for e in evs if e["type"] == "resumed_from_checkpoint"]
        assert len(resumed) == 1, types(evs)
        r = resumed[0]
        assert r["lost_sandbox"] == lost and r["sandbox_id"] != lost and r["resume_ms"] > 0
        # The newest checkpoint on record when the loss was noticed (one
        # may have been taken after `before` was read).
        ckpts = [e["snapshot_id"] for e in evs if e["type"] == "snapshot_taken" and e["seq"] < r["seq"]]
        assert ckpts and r["snapshot_id"] == ckpts[-1], (r, ckpts)
        assert r["replay_through"] > 0
        # What the re-run agent sent again was logged as `replayed` and
        # compared: the scripted model answers the same, so all match
        # (a divergence would have failed the session: runner_tests).
        replayed = [e for e in evs if e["type"] == "replayed"]
        assert all(e["n"] <= r["replay_through"] and e.get("matches") is True for e in replayed), replayed
        print(f"\n{len(replayed)} messages re-run after the resume, all matching")
        # Every model step and every command once in the log, though the
        # agent re-ran what came after the checkpoint.
        steps = [e["step"] for e in evs if e["type"] == "model_request"]
        assert steps == sorted(set(steps)), steps
        calls = [(e["call_id"], e["command"]) for e in evs if e["type"] == "command_run"]
        assert len(calls) == len(set(calls)) == 3, calls
        # The restored workspace carried on: the last command's file is there.
        assert [e for e in evs if e["type"] == "command_run"][-1]["exit_code"] == 0
        # Checkpoints go with the sandbox: none is left once it completed.
        left = d.request("GET", f"/v1/snapshots?metadata.hatchery_session={sid}").json()["snapshots"]
        assert left == [], left
    finally:
        d.cleanup_sessions()
