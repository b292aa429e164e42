"""E2B's sandbox lifecycle through the official Python SDK: `on_timeout:
pause` (autoPause) pauses instead of killing at the timeout, keeping files,
memory and the E2B id; `auto_resume` makes a request to the paused sandbox
resume it; `auto_resume: False` is accepted; a filesystem-only auto-pause
(`mode: "filesystem"`) keeps the files and not the processes."""

import os
import time

import httpx
from e2b import Sandbox, SandboxState

from harness import KEY


def wait_state(s, state, within=20):
    end = time.time() + within
    while time.time() < end:
        if Sandbox.get_info(s.sandbox_id).state == state:
            return True
        time.sleep(0.3)
    return False


def test_auto_pause_at_the_timeout_then_connect(daemon):
    s = Sandbox.create("base", timeout=4, lifecycle={"on_timeout": "pause", "auto_resume": False})
    try:
        info = s.get_info()
        assert info.lifecycle == {"on_timeout": "pause", "auto_resume": False}
        # The end E2B reports is the timeout, not Hatchery's TTL with its grace.
        assert abs((info.end_at - info.started_at).total_seconds() - 4) < 3
        s.files.write("/home/user/kept.txt", "across the auto-pause")
        s.commands.run("python3 -c 'import time; time.sleep(3600)'", background=True)
        assert wait_state(s, SandboxState.PAUSED), "not paused at its timeout"
        assert not s.is_running()  # no auto-resume: a request does not wake it
        back = Sandbox.connect(s.sandbox_id, timeout=60)
        assert back.sandbox_id == s.sandbox_id
        assert back.files.read("/home/user/kept.txt") == "across the auto-pause"
        # Memory too: the process started before the pause still runs.
        assert any("time.sleep(3600)" in " ".join([p.cmd, *p.args]) for p in back.commands.list())
        # The lifecycle is kept: it pauses again at its new timeout (set_timeout(0): now).
        assert back.get_info().lifecycle["on_timeout"] == "pause"
        back.set_timeout(0)
        assert wait_state(s, SandboxState.PAUSED), "not paused again"
    finally:
        Sandbox.kill(s.sandbox_id)


def test_auto_pause_is_on_time_after_the_sweep_went_idle(daemon):
    # With no auto-pausing sandbox running the sweep ticks every 15 s; a
    # create must wake it once the sandbox exists (woken before, it found
    # nothing and paused a 3 s sandbox about 15 s after its create).
    time.sleep(2.5)
    s = Sandbox.create("base", timeout=3, lifecycle={"on_timeout": "pause", "auto_resume": False})
    try:
        assert wait_state(s, SandboxState.PAUSED, within=9), "not paused within 9 s of a 3 s timeout"
    finally:
        Sandbox.kill(s.sandbox_id)


def test_auto_resume_on_a_request(daemon):
    s = Sandbox.create("base", timeout=3, lifecycle={"on_timeout": "pause", "auto_resume": True})
    try:
        s.files.write("/home/user/a.txt", "woken")
        assert wait_state(s, SandboxState.PAUSED)
        # Any request to the sandbox wakes it, under the same id.
        assert s.files.read("/home/user/a.txt") == "woken"
        assert Sandbox.get_info(s.sandbox_id).state == SandboxState.RUNNING
    finally:
        Sandbox.kill(s.sandbox_id)


def test_lifecycle_options_accepted_and_refused(daemon):
    # auto_resume False (sent as {"enabled": false}) with the default kill.
    s = Sandbox.create("base", timeout=30, lifecycle={"on_timeout": "kill", "auto_resume": False})
    try:
        assert s.get_info().lifecycle == {"on_timeout": "kill", "auto_resume": False}
        s.set_timeout(0)  # time out now: killed
        assert not Sandbox.kill(s.sandbox_id)
    finally:
        Sandbox.kill(s.sandbox_id)


def test_filesystem_only_auto_pause_at_the_timeout(daemon):
    s = Sandbox.create("base", timeout=4, lifecycle={"on_timeout": {"action": "pause", "mode": "filesystem"}})
    try:
        s.files.write("/home/user/kept.txt", "across a files-only auto-pause")
        s.commands.run("python3 -c 'import time; time.sleep(3600)'", background=True)
        assert wait_state(s, SandboxState.PAUSED), "not paused at its timeout"
        back = Sandbox.connect(s.sandbox_id, timeout=60)
        assert back.files.read("/home/user/kept.txt") == "across a files-only auto-pause"
        assert not any("time.sleep(3600)" in " ".join([p.cmd, *p.args]) for p in back.commands.list())
        assert back.get_info().lifecycle["on_timeout"] == "pause"
    finally:
        Sandbox.kill(s.sandbox_id)
    # E2B's rule, enforced by the API too: a files-only pause is resumed by
    # connect, never by traffic.
    r = httpx.post(f"{os.environ['E2B_API_URL']}/sandboxes", headers={"X-API-KEY": KEY},
                   json={"templateID": "base", "autoPause": True, "autoPauseMemory": False,
                         "autoResume": {"enabled": True}})
    assert r.status_code == 400 and "autoResume" in r.json()["message"], r.text
