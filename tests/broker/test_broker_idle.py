"""An approval that waits long enough for the session to be snapshotted
and freed: the decision resumes it in a new sandbox (a new epoch), the
approved push runs once from there, and the old instance is fenced."""

from broker_support import BrokerDaemon, add_repo
from pushserver import pushes


def test_approved_call_completes_after_idle_resume(model, git_server, push_server, forge):
    d = BrokerDaemon(model.port, git_server, push_server, forge, extra=["--sessions-idle-timeout", "2"]).start()
    try:
        repo, bare = add_repo(git_server, "idle")
        sid = d.new_session(repo, "[script:idle_release] release it")
        s = d.wait_state(sid, "waiting_approval")
        aid = s["pending_approval"]["approval_id"]
        d.wait_state(sid, "idle", timeout=120)
        first = next(e["sandbox_id"] for e in d.all_events(sid) if e["type"] == "sandbox_ready")
        r = d.request("POST", f"/v1/sessions/{sid}/approvals/{aid}", {"decision": "approve"})
        assert r.status == 200, r
        d.wait_state(sid, "completed", timeout=180)
        evs = d.all_events(sid)
        resumed = next(e for e in evs if e["type"] == "resumed")
        assert resumed["sandbox_id"] != first
        calls = d.calls(sid)
        assert len(calls) == 1 and calls[0]["status"] == "done", calls
        assert [p[2] for p in pushes(bare)] == ["refs/heads/release/idle"]
        assert calls[0]["output"]["commit"] == pushes(bare)[0][1]
        # Recorded from the first instance (epoch 1), completed from the
        # resumed one: the answer the agent got names epoch 2.
        told = next(e for e in evs if e["type"] == "tool_result" and e["tool"] == "git_push")
        assert '"epoch": 2' in told["output"] and '"status": "done"' in told["output"], told
        assert [e["to"] for e in evs if e["type"] == "state_changed"] == [
            "starting", "running", "waiting_approval", "idle", "running", "completed"]
        d.track_sandboxes(sid)
    finally:
        d.cleanup_sessions()
