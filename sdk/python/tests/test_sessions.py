"""`Session` against a live daemon with the scripted model as a host
service and a real git server (tests/sessions): create, events that
reconnect on their own, steering, cancel, idempotent create."""

import os
import sys

import pytest

import conftest

sys.path.insert(0, os.path.join(conftest.ROOT, "tests", "sessions"))

import hatchery  # noqa: E402
from gitserver import GitServer  # noqa: E402
from harness import KEY  # noqa: E402
from scripted_model import ScriptedModel  # noqa: E402
from sessions_support import DEMO_FILES, SCRIPTS, SessionDaemon  # noqa: E402


@pytest.fixture(scope="module")
def env():
    g = GitServer().start()
    m = ScriptedModel(SCRIPTS).start()
    d = SessionDaemon(m.port).start()
    c = hatchery.Client(f"http://127.0.0.1:{d.port}", KEY)
    yield d, c, g
    c.close()
    d.cleanup_sessions()
    m.stop()
    g.stop()


def test_session_runs_to_completion_and_events_reconnect(env):
    d, c, g = env
    repo = g.add_repo("sdk-fix", DEMO_FILES)
    s = hatchery.Session.create(repo, "[script:fix] make it pass", client=c, idempotency_key="sdk-1",
                                metadata={"tenant": "acme"})
    assert s.state in ("queued", "starting", "running")
    assert s.info["metadata"] == {"tenant": "acme"}
    again = hatchery.Session.create(repo, "[script:fix] make it pass", client=c, idempotency_key="sdk-1",
                                    metadata={"tenant": "acme"})
    assert again.id == s.id
    with pytest.raises(hatchery.Conflict):
        hatchery.Session.create(repo, "other", client=c, idempotency_key="sdk-1")
    # Break the stream after a few events: the iterator reconnects itself.
    seen = []
    it = s.events()
    for ev in it:
        seen.append(ev)
        if len(seen) in (3, 9):
            it.gi_frame.f_locals["sse"].close()  # the connection drops under it
    assert seen[-1]["type"] == "state_changed" and seen[-1]["to"] == "completed"
    assert [e["seq"] for e in seen] == list(range(1, len(seen) + 1))
    assert [e["seq"] for e in s.events(follow=False)] == [e["seq"] for e in seen]
    assert s.refresh().state == "completed"
    assert any(x.id == s.id for x in hatchery.Session.list(client=c))
    for e in seen:
        if e["type"] == "sandbox_ready":
            d.created.add(e["sandbox_id"])


def test_session_steer_and_cancel(env):
    d, c, g = env
    repo = g.add_repo("sdk-ask", DEMO_FILES)
    rules = hatchery.Policies.get("pol_standard", client=c).document["rules"]
    pol = hatchery.Policies.create("sdk-move", rules, client=c)
    s = hatchery.Session.create(repo, "[script:ask] ask me", policy_id=pol.id, client=c)
    for ev in s.events():
        if ev["type"] == "sandbox_ready":
            d.created.add(ev["sandbox_id"])
        if ev["type"] == "waiting":
            break
    # A policy move while it waits: to the latest version, back to 1.
    hatchery.Policies.add_version(pol.id, "sdk-move", rules, client=c)
    assert s.move_policy().info["policy_version"] == 2
    assert s.move_policy(1).info["policy_version"] == 1
    with pytest.raises(hatchery.BadRequest):
        s.move_policy(3)
    moved = [e for e in s.events(follow=False) if e["type"] == "policy_moved"]
    assert [(e["from_version"], e["to_version"]) for e in moved] == [(1, 2), (2, 1)]
    seq = s.message("sdk.txt")
    assert seq > 0
    s.wait("completed", timeout=240)
    assert s.info["reason"] == "agent finished: wrote sdk.txt"
    with pytest.raises(hatchery.Conflict):
        s.message("late")
    s2 = hatchery.Session.create(repo, "[script:steer] long", client=c)
    for ev in s2.events():
        if ev["type"] == "sandbox_ready":
            d.created.add(ev["sandbox_id"])
        if ev["type"] == "tool_call":
            break
    assert s2.cancel().state == "cancelled"
    assert s2.cancel().state == "cancelled"
    assert s2.info["review_snapshot_id"]


def test_environment_build_session_and_delete(env):
    d, c, g = env
    repo = g.add_repo("sdk-env", DEMO_FILES)
    e = hatchery.Environment.create("sdk", repo, setup="echo ready > .ready", client=c)
    assert e.version is None
    seen = []
    assert e.build(on_event=lambda kind, data: seen.append(kind)) == 1
    assert "step" in seen and e.version == 1
    assert [x.id for x in hatchery.Environment.list(client=c)] == [e.id]
    s = hatchery.Session.create(task="[script:quick] start", environment_id=e.id, client=c)
    s.wait("completed", timeout=300)
    assert s.info["environment_id"] == e.id and s.info["environment_version"] == 1
    d.track_sandboxes(s.id)
    e.delete()
    with pytest.raises(hatchery.errors.NotFound):
        hatchery.Environment.get(e.id, client=c)
    assert e.info["pool_size"] == 2  # the default
    bad = hatchery.Environment.create("bad", repo, setup="exit 3", pool_size=0, client=c)
    assert bad.info["pool_size"] == 0
    with pytest.raises(hatchery.errors.HatcheryError) as ex:
        bad.build()
    assert ex.value.code == "setup_failed" and "exited with 3" in str(ex.value)
    bad.delete()
