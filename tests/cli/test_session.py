"""`hatchery session ...` against a daemon with the scripted model as a
host service and a real git server (tests/sessions)."""

import json
import os
import re
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "sessions"))

from cli import Cli  # noqa: E402
from gitserver import GitServer  # noqa: E402
from scripted_model import ScriptedModel  # noqa: E402
from sessions_support import DEMO_FILES, SCRIPTS, SessionDaemon  # noqa: E402


@pytest.fixture(scope="module")
def env():
    g = GitServer().start()
    m = ScriptedModel(SCRIPTS).start()
    d = SessionDaemon(m.port).start()
    yield d, Cli(d), g
    d.cleanup_sessions()
    m.stop()
    g.stop()


def test_session_commands(env):
    d, hx, g = env
    repo = g.add_repo("cli-ask", DEMO_FILES)
    rules = d.request("GET", "/v1/policies/pol_standard").json()["document"]["rules"]
    r = d.request("POST", "/v1/policies", {"name": "cli-move", "rules": rules})
    assert r.status == 201, r
    pol = r.json()["id"]
    sid = hx("session", "create", "--repo", repo, "--task", "[script:ask] ask", "--wall", "600",
             "--policy", pol, "--metadata", "tenant=acme", "-m", "team=infra", check=0).stdout.strip()
    assert re.fullmatch(r"ses_[a-z0-9]{16}", sid), sid
    d.wait_event(sid, "waiting")
    assert d.request("POST", f"/v1/policies/{pol}/versions", {"name": "cli-move", "rules": rules}).status in (200, 201)
    assert hx("session", "policy", sid, check=0).stdout.strip() == f"{pol} v2"
    assert json.loads(hx("session", "policy", sid, "--version", "1", "--json", check=0).stdout)["policy_version"] == 1
    p = hx("session", "policy", sid, "--version", "3")
    assert p.returncode != 0 and "400" in p.stderr, p.stderr
    assert hx("session", "message", sid, "cli.txt", check=0).stdout.strip().isdigit()
    # --follow streams until the end and exits 0 for completed.
    p = hx("session", "events", sid, "--follow", "--json", timeout=300, check=0)
    evs = [json.loads(line) for line in p.stdout.splitlines()]
    assert evs[-1]["type"] == "state_changed" and evs[-1]["to"] == "completed"
    assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1))
    # --after skips what was seen; the plain listing is the same log.
    listed = hx("session", "events", sid, "--after", "3", check=0).stdout.splitlines()
    assert len(listed) == len(evs) - 3 and listed[0].split()[0] == "4"
    got = json.loads(hx("session", "get", sid, "--json", check=0).stdout)
    assert got["state"] == "completed" and got["reason"] == "agent finished: wrote cli.txt"
    assert got["metadata"] == {"tenant": "acme", "team": "infra"}
    assert sid in hx("session", "ls", check=0).stdout
    assert json.loads(hx("session", "ls", "--state", "failed", "--json", check=0).stdout) == []
    p = hx("session", "message", sid, "late")
    assert p.returncode != 0 and "409" in p.stderr
    d.track_sandboxes(sid)

    sid = hx("session", "create", "--repo", repo, "--task", "[script:approve] push", check=0).stdout.strip()
    s = d.wait_state(sid, "waiting_approval")
    hx("session", "approve", sid, s["pending_approval"]["approval_id"], "--note", "ok", check=0)
    d.wait_state(sid, "completed")
    d.track_sandboxes(sid)

    sid = hx("session", "create", "--repo", repo, "--task", "[script:steer] long", check=0).stdout.strip()
    d.wait_event(sid, "tool_call")
    assert hx("session", "cancel", sid, timeout=200, check=0).stdout.strip() == "cancelled"
    assert hx("session", "cancel", sid, check=0).stdout.strip() == "cancelled"
    p = hx("session", "events", sid, "--follow", timeout=60)
    assert p.returncode == 1 and "cancelled" in p.stdout.splitlines()[-1]
    d.track_sandboxes(sid)

    p = hx("session", "create", "--repo", "ssh://h/r.git", "--task", "t")
    assert p.returncode != 0 and "invalid_repo" in p.stderr
    p = hx("session", "get", "nope")
    assert p.returncode != 0


def test_env_commands(env):
    """`hatchery env create/build/ls/get/rm` and `session create
    --environment`: the build's version on stdout, a failed set-up's
    reason and a non-zero exit, 409 while a session uses it."""
    d, hx, g = env
    repo = g.add_repo("cli-env", DEMO_FILES)
    eid = hx("env", "create", "--name", "cli", "--repo", repo, "--setup", "echo ready > .ready",
             "--allow", '{"cidr": "10.9.9.9", "ports": [80]}', check=0).stdout.strip()
    assert re.fullmatch(r"env_[a-z0-9]{16}", eid), eid
    p = hx("env", "build", eid, timeout=600, check=0)
    assert p.stdout.strip() == "1", (p.stdout, p.stderr)
    assert "done" in p.stderr
    listed = json.loads(hx("env", "ls", "--json", check=0).stdout)
    assert [(e["environment_id"], e["current"]["version"]) for e in listed] == [(eid, 1)]
    got = json.loads(hx("env", "get", eid, "--json", check=0).stdout)
    assert got["setup_allow"] == [{"cidr": "10.9.9.9", "ports": [80]}]
    assert eid in hx("env", "ls", check=0).stdout
    sid = hx("session", "create", "--environment", eid, "--task", "[script:ask] ask", check=0).stdout.strip()
    d.wait_event(sid, "waiting")
    assert d.session(sid)["environment_version"] == 1
    p = hx("env", "rm", eid)
    assert p.returncode != 0 and "environment_conflict" in p.stderr, (p.stdout, p.stderr)
    hx("session", "cancel", sid, check=0)
    d.track_sandboxes(sid)
    hx("env", "rm", eid, check=0)
    assert json.loads(hx("env", "ls", "--json", check=0).stdout) == []
    bad = hx("env", "create", "--name", "bad", "--repo", repo, "--setup", "echo nope >&2; exit 3",
             "--pool-size", "0", check=0).stdout.strip()
    assert json.loads(hx("env", "get", bad, "--json", check=0).stdout)["pool_size"] == 0
    p = hx("env", "build", bad, timeout=600)
    assert p.returncode != 0 and "setup_failed" in p.stderr and "nope" in p.stderr, (p.stdout, p.stderr)
    hx("env", "rm", bad, check=0)
