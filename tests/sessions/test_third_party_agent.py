"""A third-party agent, installed from PyPI and run unmodified in a session:
mini-swe-agent (`mini`), through its own model layer (litellm), against the
scripted model over the same host-services relay the reference agent uses.

The template installs the pinned wheels (tests/sessions/agent-requirements.txt,
downloaded by `make sessions-test` into the test cache, tests/cache.py) with the host's
pip at rootfs time (the template spec's `pip` list), offline: the daemon gets
PIP_NO_INDEX and PIP_FIND_LINKS, which is how an operator points template
builds at an internal index too."""

import os
import shutil
import tempfile

import pytest

from sessions_support import DEMO_FILES, SessionDaemon

HERE = os.path.dirname(os.path.abspath(__file__))
WHEELS = os.environ.get("HATCHERY_AGENT_WHEELS", os.path.join(HERE, "..", "..", "target", "wheels", "swe"))
SPEC = {"name": "tpl-swe", "pip": ["mini-swe-agent==2.4.6"], "memory_mb": 1024, "disk_mb": 256}

# The command is the agent's own CLI, unmodified; the wrapper only reads the
# task from the session file Hatchery writes. The environment is
# mini-swe-agent's documented switches: no first-run wizard, no cost lookup
# for a model litellm does not know, litellm's bundled price map (no fetch).
MINI = ("mini -y --exit-immediately -m openai/scripted -o /tmp/mini-traj.json "
        "-t \"$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[\"task\"])' \"$HATCHERY_TASK_FILE\")\"")
MINI_ENV = {"MSWEA_CONFIGURED": "true", "MSWEA_COST_TRACKING": "ignore_errors",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HOME": "/root"}


@pytest.fixture(scope="module")
def swe(model):
    if not os.path.isfile(os.path.join(WHEELS, ".complete")):
        pytest.fail(f"no wheelhouse at {WHEELS}: run `make sessions-test` (tests/cache.py wheels downloads it)")
    tdir = tempfile.mkdtemp(prefix="hxswe-", dir="/tmp")
    saved = {k: os.environ.get(k) for k in ("PIP_NO_INDEX", "PIP_FIND_LINKS")}
    os.environ.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=os.path.abspath(WHEELS))
    try:
        d = SessionDaemon(model.port, extra=["--pool-size", "0"], templates_dir=tdir).start()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        r = d.request("POST", "/v1/templates", SPEC)
        assert r.status == 202, r
        events = d.stream(None, None, path=r.json()["events_url"], method="GET", timeout=900)
        assert events[-1][0] == "done", events[-8:]
        logs = [e[1].get("line", "") for e in events if e[0] == "log"]
        assert any(line.startswith("pip: mini-swe-agent==2.4.6") for line in logs), logs[-20:]
        yield d
    finally:
        d.cleanup_sessions()
        shutil.rmtree(tdir, ignore_errors=True)


# Longer than the default: its fixture builds a template (a rootfs with
# pip wheels) through the API before the session runs.
@pytest.mark.timeout(1200)
def test_mini_swe_agent_fixes_the_failing_test(swe, git_server, model):
    d = swe
    r = d.request("GET", "/v1/templates/tpl-swe")
    assert r.status == 200 and r.json()["pip"] == ["mini-swe-agent==2.4.6"], r
    repo = git_server.add_repo("calc-mini", DEMO_FILES)
    sid = d.new_session(repo, "[script:mini-fix] The test in test_calc.py fails. Make it pass.",
                        template="tpl-swe", agent={"kind": "command", "command": MINI}, env=MINI_ENV,
                        budget={"tokens": 100000, "wall_s": 600})
    s = d.wait_state(sid, ("completed", "failed"), timeout=300)
    d.track_sandboxes(sid)
    evs = d.all_events(sid)
    assert s["state"] == "completed", (s, [e for e in evs if e["type"] in ("agent_output", "agent_exited")][-10:])
    assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1))
    started = next(e for e in evs if e["type"] == "agent_started")
    assert started["agent"] == "command"
    # The fix is the agent's work, seen in the workspace diff.
    diff = next(e for e in evs if e["type"] == "workspace_diff")
    assert "-    return a - b" in diff["patch"] and "+    return a + b  # fixed" in diff["patch"], diff
    # It talked to the model only through the relay, from its own sandbox,
    # with the task in its first user message, and saw the tests fail and then
    # pass in the tool results it sent back.
    sbx = next(e["sandbox_id"] for e in evs if e["type"] == "sandbox_ready")
    mine = [r for r in model.requests if r["sandbox"] == sbx]
    assert len(mine) == 3, [r.get("path") for r in mine]
    last = mine[-1]["body"]["messages"]
    tool_results = [m["content"] if isinstance(m["content"], str) else str(m["content"])
                    for m in last if m["role"] == "tool"]
    assert "FAILED" in tool_results[0] and "OK" in tool_results[1], tool_results
    assert [t["function"]["name"] for t in mine[0]["body"]["tools"]] == ["bash"]
