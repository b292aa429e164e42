"""A template rebuilt under a running session changes nothing of it
(issue 37 item 4), end to end with real runsc sandboxes and real template
builds: the session's sandbox, its checkpoints and the sandbox it resumes
in keep the template version it started on, while new sandboxes get the
new one.

The test's daemon has a templates directory of its own (a copy of the
default template's, so the build reuses its root filesystem); version 1
of `code-interpreter` writes `v1` to /opt/tpl-version in its setup. A
session starts on it and reads the file; the template is rebuilt (setup
writes `v2`); a checkpoint is taken after the rebuild; the session's
sandbox is deleted under it (a lost sandbox), so it resumes from that
checkpoint; the agent reads the file again on the resumed sandbox."""

import json
import os
import shutil
import subprocess
import tempfile
import time

import pytest

from scripted_model import ScriptedModel
from sessions_support import DEMO_FILES, SessionDaemon

TEMPLATES = os.environ.get("HATCHERY_TEMPLATES_DIR", "/var/lib/hatchery/templates")
SPEC_FILE = os.path.join(os.path.dirname(__file__), "..", "..", "templates", "code-interpreter.json")
READ = "cat /opt/tpl-version"


def spec(version):
    with open(SPEC_FILE) as f:
        s = json.load(f)
    s["setup"] = [f"echo {version} > /opt/tpl-version"]
    return s


def build(d, s):
    """Builds through the API and follows its event stream to the end;
    the version built."""
    r = d.request("POST", "/v1/templates", s)
    assert r.status == 202, r
    acc = r.json()
    events = d.stream(None, None, path=acc["events_url"], method="GET", timeout=600)
    assert events and events[-1][0] == "done", events[-3:]
    return events[-1][1]["version"]


def waiting_for_message(d, sid, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        s = d.session(sid)
        if s["waiting"] == "message":
            return s
        assert s["state"] in ("starting", "running"), s
        time.sleep(0.2)
    raise AssertionError(f"the agent did not ask within {timeout}s")


def runs(d, sid):
    return [e for e in d.all_events(sid) if e["type"] == "command_run" and e["command"] == READ]


@pytest.fixture
def model():
    m = ScriptedModel({"rebuild": [
        {"tool_calls": [{"name": "shell", "arguments": {"command": READ}}]},
        {"content": "Go on?"},
        {"tool_calls": [{"name": "shell", "arguments": {"command": READ}}]},
        {"tool_calls": [{"name": "finish", "arguments": {"summary": "read twice"}}]},
    ]}).start()
    yield m
    m.stop()


@pytest.mark.timeout(900)
def test_a_rebuild_mid_session_changes_nothing_of_it(model, git_server):
    tdir = tempfile.mkdtemp(prefix="hxtplsess-", dir="/tmp")
    # cp -a, not shutil.copytree: the rootfs's /dev holds device nodes,
    # which copytree would read (/dev/zero without end).
    subprocess.run(["cp", "-a", os.path.join(TEMPLATES, "code-interpreter"), tdir], check=True)
    d = SessionDaemon(model.port, templates_dir=tdir,
                      extra=["--pool-size", "0", "--sessions-checkpoint-interval", "2",
                             "--sessions-idle-timeout", "600"]).start()
    try:
        v1 = build(d, spec("v1"))
        sid = d.new_session(git_server.add_repo("rebuild", DEMO_FILES), "[script:rebuild] read",
                            budget={"tokens": 100000, "wall_s": 900})
        first = d.wait_event(sid, "command_run", timeout=240)
        assert (first["command"], first["output"].strip()) == (READ, "v1"), first
        s = waiting_for_message(d, sid)
        assert s["state"] == "running" and s["sandbox_id"], s
        before = s["sandbox_id"]

        v2 = build(d, spec("v2"))
        assert v2 != v1
        t = d.request("GET", "/v1/templates/code-interpreter").json()
        assert t["version"] == v2 and t["checkpoint_ready"], t
        # A new sandbox gets the new version: the rebuild took.
        fresh = d.create(template="code-interpreter")
        assert d.exec(fresh, READ)["stdout"].strip() == "v2"
        d.delete(fresh)

        # A checkpoint taken after the rebuild, of the sandbox booted on v1.
        done = d.all_events(sid)[-1]["seq"]
        ckpt = d.wait_event(sid, "snapshot_taken", after=done, timeout=120)
        assert ckpt["purpose"] == "checkpoint"
        d.track_sandboxes(sid)
        assert d.request("DELETE", f"/v1/sandboxes/{before}").status == 204
        resumed = d.wait_event(sid, "resumed_from_checkpoint", timeout=240)
        assert resumed["lost_sandbox"] == before and resumed["sandbox_id"] != before
        d.track_sandboxes(sid)

        # The agent goes on in the resumed sandbox: still v1's files.
        assert d.request("POST", f"/v1/sessions/{sid}/messages", {"text": "yes"}).status == 202
        s = d.wait_state(sid, "completed", timeout=240)
        assert s["reason"] == "agent finished: read twice", s
        reads = runs(d, sid)
        assert [r["output"].strip() for r in reads] == ["v1", "v1"], reads
        d.track_sandboxes(sid)
    finally:
        d.cleanup_sessions()
        shutil.rmtree(tdir, ignore_errors=True)

