"""Environments end to end with real runsc sandboxes: a build runs the
set-up once with its own egress (a server in a network namespace this test
creates), closes it and snapshots; sessions fork that snapshot, get the
commits their ref is ahead, cannot reach what the set-up could, do not see
each other's writes; a failed set-up makes no version and says why; the
snapshot holds no deploy credential; bad input is a 4xx that leaves
nothing; an environment in use cannot be deleted."""

import glob
import http.client
import json
import os
import shutil
import subprocess
import tempfile
import time
from datetime import datetime

import pytest

from gitserver import GIT_ENV, git
from harness import KEY, metric
from netlab import Peer, probe_cmd
from sessions_support import DEMO_FILES, SessionDaemon

# The deploy credential the daemon sends with its host-side fetches; it
# must never be found inside an environment's snapshot.
TOKEN = "hx-deploy-token-5f0c1e9a7b"
# What the set-up writes: found by the same scan, so the scan can fail.
CANARY = "hx-setup-canary-93d2"


@pytest.fixture(scope="module")
def peer():
    p = Peer().up()
    yield p
    p.down()


@pytest.fixture
def ed(model):
    """A sessions daemon with a deploy credential for its fetches."""
    d = tempfile.mkdtemp(prefix="hxt-envcred-")
    cred = os.path.join(d, "git-credential")
    with open(cred, "w") as f:
        f.write(f"Authorization: Bearer {TOKEN}\n")
    s = SessionDaemon(model.port, extra=["--sessions-git-credential-file", cred]).start()
    yield s
    try:
        r = s.request("GET", "/v1/environments")
        if r.status == 200:
            for e in r.json()["environments"]:
                s.request("DELETE", f"/v1/environments/{e['environment_id']}")
    finally:
        s.cleanup_sessions()
        shutil.rmtree(d, ignore_errors=True)


def build(d, eid, key=KEY):
    """POST :build (with API key `key`) and read its SSE stream to the
    end: [(event, data)]."""
    conn = http.client.HTTPConnection(d.addr, d.port, timeout=900)
    conn.request("POST", f"/v1/environments/{eid}:build",
                 headers={"Authorization": f"Bearer {key}", "Accept": "text/event-stream"})
    r = conn.getresponse()
    assert r.status == 200, (r.status, r.read())
    out, ev, data = [], None, []
    while True:
        line = r.readline()
        if not line:
            break
        line = line.decode().rstrip("\n")
        if line.startswith("event:"):
            ev = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())
        elif line == "" and ev:
            out.append((ev, json.loads("\n".join(data))))
            ev, data = None, []
    conn.close()
    return out


def create_env(d, **body):
    r = d.request("POST", "/v1/environments", body)
    assert r.status == 201, r
    return r.json()


def push_commits(git_server, name, n, last_files):
    """`n` commits on main of repo `name`: n-1 that each add a file, then
    one that writes `last_files` (None deletes)."""
    work = tempfile.mkdtemp(prefix="hxgitw-")
    try:
        bare = os.path.join(git_server.root, name + ".git")
        git("clone", "-q", bare, work)
        for i in range(n - 1):
            with open(os.path.join(work, f"step{i}.txt"), "w") as f:
                f.write(f"step {i}\n")
            git("add", ".", cwd=work)
            git("commit", "-q", "-m", f"step {i}", cwd=work)
        for path, content in last_files.items():
            p = os.path.join(work, path)
            if content is None:
                os.remove(p)
            else:
                os.makedirs(os.path.dirname(p) or work, exist_ok=True)
                with open(p, "w") as f:
                    f.write(content)
        git("add", "-A", ".", cwd=work)
        git("commit", "-q", "-m", "last", cwd=work)
        git("push", "-q", "origin", "main", cwd=work)
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=work, env=GIT_ENV, check=True,
                              capture_output=True, text=True).stdout.strip()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def agent_output(d, sid):
    return "".join(e["text"] for e in d.all_events(sid) if e["type"] == "agent_output")


def run_command_session(d, eid, command, **kw):
    r = d.request("POST", "/v1/sessions", {"environment_id": eid, "task": "inspect",
                                           "agent": {"kind": "command", "command": command}, **kw})
    assert r.status == 201, r
    sid = r.json()["session_id"]
    s = d.wait_state(sid, ("completed",), timeout=300)
    d.track_sandboxes(sid)
    return sid, s


def test_build_once_sessions_fork_get_the_delta_and_lose_setup_egress(ed, git_server, peer):
    repo = git_server.add_repo("envcalc", dict(DEMO_FILES, **{"lib/old.py": "OLD = 1\n"}))
    # The set-up must reach the peer (a UDP round trip through its own
    # hole) or it fails; it leaves a marker outside git's tracked files
    # and the canary the token scan must find.
    udp = f"udp,{peer.addr},9999"
    # (Tried up to three times: a first connection out of a fresh sandbox
    # has timed out under load, docs/testing.md "Known flake".)
    setup = (f"for i in 1 2 3; do {probe_cmd(udp)} > /tmp/setup-net.json;"
             f" grep -q '\"open:' /tmp/setup-net.json && break; done;"
             f" grep -q '\"open:' /tmp/setup-net.json"
             f" && echo installed > .setup-done && echo {CANARY} > /opt/canary.txt")
    env = create_env(ed, name="calc", repo=repo, setup=setup, setup_allow=[{"cidr": peer.addr}])
    eid = env["environment_id"]
    assert env["current"] is None and env["versions"] == [] and env["repo"] == repo and env["ref"] == "main"
    evs = build(ed, eid)
    names = [e for e, _ in evs]
    assert names[-1] == "done", evs
    steps = [d["step"] for e, d in evs if e == "step"]
    assert steps == ["sandbox", "fetch", "setup", "close_egress", "snapshot"], steps
    done = evs[-1][1]
    assert done["version"] == 1
    got = ed.request("GET", f"/v1/environments/{eid}").json()
    assert got["current"]["version"] == 1 and got["current"]["snapshot_id"] == done["snapshot_id"]
    base = got["current"]["base_commit"]
    assert len(base) == 40 and got["last_error"] is None

    # The snapshot holds no deploy credential: a fork of it, searched
    # whole, has the canary the set-up wrote and not the token.
    r = ed.request("POST", f"/v1/snapshots/{done['snapshot_id']}/fork", {"count": 1})
    assert r.status in (200, 201), r
    fork = r.json()
    fork = fork["sandboxes"][0]["id"] if isinstance(fork, dict) and "sandboxes" in fork else fork[0]["id"]
    ed.created.add(fork)
    scan = "grep -rlsa --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev -e {} / || true"
    assert "/opt/canary.txt" in ed.exec(fork, scan.format(CANARY))["stdout"]
    assert ed.exec(fork, scan.format(TOKEN))["stdout"].strip() == ""
    assert ed.request("DELETE", f"/v1/sandboxes/{fork}").status in (200, 204)

    # main moves 20 commits ahead: 19 new files, then calc.py fixed and
    # lib/old.py deleted.
    fixed = "def add(a, b):\n    return a + b  # env fixed\n"
    head = push_commits(git_server, "envcalc", 20, {"calc.py": fixed, "lib/old.py": None})

    # Session 1: the set-up's output is there, the 20 commits are, the
    # deleted file is gone, the peer the set-up reached is not reachable
    # (TCP and UDP), and it leaves a file behind.
    probe = probe_cmd(f"tcp,{peer.addr},80", udp)
    check = ("cat .setup-done; echo STEPS=$(ls step*.txt | wc -l); cat calc.py; test -e lib/old.py && echo OLD-THERE;"
             f" {probe}; echo; echo mine > s1.txt")
    s1, v1 = run_command_session(ed, eid, check)
    assert v1["environment_id"] == eid and v1["environment_version"] == 1, v1
    out = agent_output(ed, s1)
    assert "installed" in out and "env fixed" in out and "OLD-THERE" not in out, out
    assert "STEPS=19" in out, out
    results = json.loads(out[out.index("{"):out.rindex("}") + 1])
    assert all(v.startswith("blocked:") for v in results.values()), results
    checked = next(e for e in ed.all_events(s1) if e["type"] == "repo_checked_out")
    assert checked["commit"] == head
    ready = next(e for e in ed.all_events(s1) if e["type"] == "sandbox_ready")
    # Claimed from the version's warm pool if its refill was done, else
    # restored (test_a_hot_environment_... pins the pool down).
    assert ready["boot_mode"] in (f"environment {eid} v1 pool", f"environment {eid} v1 fork"), ready
    # Its final diff is the agent's work only: not the delta, not the set-up.
    diff = next(e for e in ed.all_events(s1) if e["type"] == "workspace_diff")
    assert "s1.txt" in diff["stat"] and "calc.py" not in diff["stat"] and ".setup-done" not in diff["stat"], diff

    # Session 2, from the same version: s1's file is not there.
    s2, _ = run_command_session(ed, eid, "test -e s1.txt && echo S1-LEAKED; cat .setup-done")
    out2 = agent_output(ed, s2)
    assert "installed" in out2 and "S1-LEAKED" not in out2, out2

    # In use: a running session holds the environment.
    r = ed.request("POST", "/v1/sessions", {"environment_id": eid, "task": "wait",
                                            "agent": {"kind": "command", "command": "sleep 120"}})
    assert r.status == 201, r
    s3 = r.json()["session_id"]
    ed.wait_state(s3, "running")
    r = ed.request("DELETE", f"/v1/environments/{eid}")
    assert (r.status, r.error_code()) == (409, "environment_conflict"), r
    assert ed.request("POST", f"/v1/sessions/{s3}:cancel").status == 200
    ed.track_sandboxes(s3)
    assert ed.request("DELETE", f"/v1/environments/{eid}").status == 204
    assert ed.request("GET", f"/v1/environments/{eid}").status == 404
    assert ed.request("GET", f"/v1/snapshots/{done['snapshot_id']}").status == 404


def test_failed_setup_makes_no_version_and_says_why(ed, git_server):
    repo = git_server.add_repo("envfail", DEMO_FILES)
    eid = create_env(ed, name="broken", repo=repo, setup="echo pip-says-no >&2; exit 3")["environment_id"]
    evs = build(ed, eid)
    ev, data = evs[-1]
    assert ev == "error" and data["error"]["code"] == "setup_failed", evs
    assert "exited with 3" in data["error"]["message"] and "pip-says-no" in data["error"]["message"]
    got = ed.request("GET", f"/v1/environments/{eid}").json()
    assert got["current"] is None and got["versions"] == [] and "pip-says-no" in got["last_error"], got
    assert ed.request("GET", "/v1/snapshots").json()["snapshots"] == []
    r = ed.request("POST", "/v1/sessions", {"environment_id": eid, "task": "t"})
    assert (r.status, r.error_code()) == (409, "environment_not_built"), r


def test_a_full_snapshot_store_refuses_the_build_and_keeps_nothing(model, git_server):
    """A daemon whose snapshot store is capped at 1 MiB (an image here is
    several): a sandbox's snapshot is 507 `snapshot_store_full`; an
    environment's build ends with that code and makes no version; nothing
    is kept (no snapshot row, no image, no sandbox)."""
    d = SessionDaemon(model.port, extra=["--snapshot-store-max-mb", "1"]).start()
    try:
        sid = d.create(ttl_seconds=120)
        r = d.request("POST", f"/v1/sandboxes/{sid}/snapshots", {})
        assert (r.status, r.error_code()) == (507, "snapshot_store_full"), r
        assert "--snapshot-store-max-mb" in r.json()["error"]["message"]
        assert d.request("DELETE", f"/v1/sandboxes/{sid}").status == 204
        repo = git_server.add_repo("envfull", DEMO_FILES)
        eid = create_env(d, name="full", repo=repo, setup="echo installed > .setup-done")["environment_id"]
        evs = build(d, eid)
        ev, data = evs[-1]
        assert ev == "error" and data["error"]["code"] == "snapshot_store_full", data
        got = d.request("GET", f"/v1/environments/{eid}").json()
        assert got["current"] is None and got["versions"] == [], got
        assert "snapshot store full" in got["last_error"], got
        assert d.request("GET", "/v1/snapshots").json()["snapshots"] == []
        assert os.listdir(os.path.join(d.data_dir, "snapshots")) == []
        assert metric(d, "hatchery_snapshot_store_full_total") == 2
        assert d.request("DELETE", f"/v1/environments/{eid}").status == 204
    finally:
        d.cleanup_sessions()


def test_bad_input_is_4xx_and_leaves_nothing(ed, git_server):
    repo = git_server.add_repo("envbad", DEMO_FILES)
    ok = {"name": "x", "repo": repo}
    cases = [
        ({**ok, "name": ""}, 400),
        ({**ok, "name": "n" * 65}, 400),
        ({**ok, "repo": "ssh://example.invalid/r.git"}, 400),
        ({**ok, "ref": "-x"}, 400),
        ({**ok, "setup": "x" * (64 * 1024 + 1)}, 400),
        ({**ok, "setup_allow": [{"cidr": "10.0.0.1"}] * 65}, 400),
        ({**ok, "setup_allow": ["10.0.0.1"]}, 400),
        ({**ok, "setup_timeout_s": 0}, 400),
        ({**ok, "setup_timeout_s": 3601}, 400),
        ({**ok, "template": "no-such-template"}, 404),
        ({**ok, "surprise": 1}, 400),
    ]
    for body, status in cases:
        r = ed.request("POST", "/v1/environments", body)
        assert r.status == status, (body if len(json.dumps(body)) < 300 else list(body), r)
    assert ed.request("GET", "/v1/environments").json()["environments"] == []
    # At the caps exactly: accepted.
    edge = create_env(ed, name="n" * 64, repo=repo, setup="x" * (64 * 1024),
                      setup_allow=[{"cidr": "10.0.0.1"}] * 64, setup_timeout_s=3600)
    eid = edge["environment_id"]
    assert ed.request("GET", "/v1/environments/env_nosuchenvironm1").status == 404
    assert ed.request("POST", "/v1/environments/nope:build").status == 404
    assert ed.request("POST", f"/v1/environments/{eid}:frobnicate").status == 400
    r = ed.request("POST", "/v1/sessions", {"environment_id": "env_nosuchenvironm1", "task": "t"})
    assert (r.status, r.error_code()) == (404, "environment_not_found"), r
    r = ed.request("POST", "/v1/sessions", {"environment_id": eid, "task": "t", "repo": repo + "x"})
    assert r.status in (400, 409), r
    assert ed.request("GET", "/v1/sessions").json()["sessions"] == []
    assert ed.request("DELETE", f"/v1/environments/{eid}").status == 204


TEMPLATES = os.environ.get("HATCHERY_TEMPLATES_DIR", "/var/lib/hatchery/templates")
TEMPLATE_SPEC = os.path.join(os.path.dirname(__file__), "..", "..", "templates", "code-interpreter.json")


def build_template(d, version):
    """Builds `code-interpreter` through the API with a setup that writes
    `version` to /opt/tpl-version; the template version built."""
    with open(TEMPLATE_SPEC) as f:
        s = json.load(f)
    s["setup"] = [f"echo {version} > /opt/tpl-version"]
    r = d.request("POST", "/v1/templates", s)
    assert r.status == 202, r
    events = d.stream(None, None, path=r.json()["events_url"], method="GET", timeout=600)
    assert events and events[-1][0] == "done", events[-3:]
    return events[-1][1]["version"]


# The template version a session's files come from, and the one the
# environment's set-up ran on.
READ_VERSIONS = "echo T=$(cat /opt/tpl-version) ENV=$(cat .built-on)"


def start_command_session(d, eid, command):
    r = d.request("POST", "/v1/sessions", {"environment_id": eid, "task": "inspect",
                                           "agent": {"kind": "command", "command": command}})
    assert r.status == 201, r
    return r.json()["session_id"]


@pytest.mark.timeout(1200)
def test_a_template_rebuild_rebuilds_the_environment_and_sessions_keep_the_old_version(model, git_server):
    """Issue 40: rebuilt when the template changes, the previous version
    kept until the new one is ready. The daemon has a templates directory
    of its own (a copy of the default template's, as in
    test_sessions_rebuild.py); its template's setup writes v1, then v2, to
    /opt/tpl-version, which an environment's snapshot (and every session
    forked from it) inherits. The environment's set-up takes 25 s more on
    v2, the window in which sessions must still start from version 1."""
    tdir = tempfile.mkdtemp(prefix="hxtplenv-", dir="/tmp")
    # cp -a, not shutil.copytree: the rootfs's /dev holds device nodes.
    subprocess.run(["cp", "-a", os.path.join(TEMPLATES, "code-interpreter"), tdir], check=True)
    d = SessionDaemon(model.port, templates_dir=tdir, extra=["--pool-size", "0"]).start()
    try:
        t1 = build_template(d, "v1")
        repo = git_server.add_repo("envtpl", DEMO_FILES)
        setup = "if grep -q v2 /opt/tpl-version; then sleep 25; fi; cp /opt/tpl-version .built-on"
        eid = create_env(d, name="tpl", repo=repo, setup=setup)["environment_id"]
        assert build(d, eid)[-1][0] == "done"
        env = d.request("GET", f"/v1/environments/{eid}").json()
        cur = env["current"]
        assert (cur["version"], cur["reason"], cur["template_version"]) == (1, "requested", t1), env
        assert env["template_version"] == t1 and env["stale"] is False, env

        t2 = build_template(d, "v2")
        assert t2 != t1
        env = d.request("GET", f"/v1/environments/{eid}").json()
        assert env["template_version"] == t2 and env["stale"] is True, env
        assert env["current"]["version"] == 1

        # Two sessions asked for while the rebuild runs: both from version
        # 1 (v1's files); the first one's ask starts the rebuild if the
        # daemon's sweep has not yet. The first runs across the switch.
        long_cmd = f"{READ_VERSIONS}; sleep 75; echo AFTER=$(cat /opt/tpl-version)"
        a = start_command_session(d, eid, long_cmd)
        env = d.request("GET", f"/v1/environments/{eid}").json()
        assert env["building"] is True and env["building_reason"] == "template_changed", env
        b = start_command_session(d, eid, READ_VERSIONS)
        env = d.request("GET", f"/v1/environments/{eid}").json()
        assert env["building"] is True and env["current"]["version"] == 1, env
        for sid in (a, b):
            assert d.session(sid)["environment_version"] == 1
        d.wait_state(b, ("completed",), timeout=300)
        d.track_sandboxes(b)
        assert "T=v1 ENV=v1" in agent_output(d, b), agent_output(d, b)

        # The new version, once ready: made because the template changed,
        # from t2; version 1 kept (a running session pinned it).
        deadline = time.time() + 600
        while True:
            env = d.request("GET", f"/v1/environments/{eid}").json()
            if not env["building"]:
                break
            assert time.time() < deadline, env
            time.sleep(1)
        cur = env["current"]
        assert env["last_error"] is None, env
        assert (cur["version"], cur["reason"], cur["template_version"]) == (2, "template_changed", t2), env
        assert env["stale"] is False and [v["version"] for v in env["versions"]] == [2, 1], env
        # Session a, on version 1, is still running across the switch.
        assert d.session(a)["state"] == "running", d.session(a)

        # New sessions start from version 2.
        c = start_command_session(d, eid, READ_VERSIONS)
        assert d.session(c)["environment_version"] == 2
        d.wait_state(c, ("completed",), timeout=300)
        d.track_sandboxes(c)
        assert "T=v2 ENV=v2" in agent_output(d, c), agent_output(d, c)
        ready = next(e for e in d.all_events(c) if e["type"] == "sandbox_ready")
        assert ready["boot_mode"] in (f"environment {eid} v2 pool", f"environment {eid} v2 fork"), ready

        # The session on version 1 ends as it would have: its files v1's.
        s = d.wait_state(a, ("completed",), timeout=300)
        d.track_sandboxes(a)
        assert s["environment_version"] == 1
        out = agent_output(d, a)
        assert "T=v1 ENV=v1" in out and "AFTER=v1" in out, out
        # Nothing more to rebuild.
        env = d.request("GET", f"/v1/environments/{eid}").json()
        assert env["stale"] is False and env["building"] is False and env["current"]["version"] == 2, env
    finally:
        try:
            for e in d.request("GET", "/v1/environments").json().get("environments", []):
                d.request("DELETE", f"/v1/environments/{e['environment_id']}")
        finally:
            d.cleanup_sessions()
            shutil.rmtree(tdir, ignore_errors=True)


def pool_of(d, snap):
    r = d.request("GET", f"/v1/snapshots/{snap}/pool")
    return r.json() if r.status == 200 else None


def wait_pool(d, snap, ready, timeout=180):
    deadline = time.time() + timeout
    while True:
        p = pool_of(d, snap)
        if p is not None and p["ready"] == ready:
            return p
        assert time.time() < deadline, (snap, p, d.log()[-3000:])
        time.sleep(0.2)


def host_traces(d, ids):
    """What is left on the host of sandboxes `ids`: processes, cgroups,
    state directories."""
    left = []
    for p in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            cmd = open(p, "rb").read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        left += [f"process {p}: {cmd[:100]}" for i in ids if i in cmd]
    for i in ids:
        left += glob.glob(f"/sys/fs/cgroup/*/{i}")
        if os.path.exists(os.path.join(d.data_dir, "sandboxes", i)):
            left.append(f"state of {i}")
    return left


def wait_gone(d, ids, timeout=90):
    deadline = time.time() + timeout
    while host_traces(d, ids):
        assert time.time() < deadline, host_traces(d, ids)
        time.sleep(0.3)


def start_ms(d, sid):
    at = {}
    for e in d.all_events(sid):
        key = e["type"] if e["type"] != "state_changed" else "to_" + e["to"]
        at.setdefault(key, datetime.fromisoformat(e["at"].replace("Z", "+00:00")).timestamp())
    return (at["to_running"] - at["session_created"]) * 1000


def test_a_hot_environment_serves_sessions_from_its_warm_pool(ed, git_server, peer):
    """Issue 40's warm pool: a built version keeps `pool_size` sandboxes
    restored from its snapshot, parked; a session claims one (its
    sandbox_ready says `pool`), sessions from it are independent and
    cannot reach what the set-up could; the pool refills; a rebuild drops
    the superseded version's pool and deleting the environment the
    current one's, leaving nothing on the host."""
    repo = git_server.add_repo("envpool", DEMO_FILES)
    udp = f"udp,{peer.addr},9999"
    setup = (f"for i in 1 2 3; do {probe_cmd(udp)} > /tmp/setup-net.json;"
             f" grep -q '\"open:' /tmp/setup-net.json && break; done;"
             f" grep -q '\"open:' /tmp/setup-net.json && echo installed > .setup-done")
    env = create_env(ed, name="pooled", repo=repo, setup=setup, setup_allow=[{"cidr": peer.addr}],
                     pool_size=2)
    eid = env["environment_id"]
    assert env["pool_size"] == 2
    v1 = build(ed, eid)[-1][1]["snapshot_id"]
    wait_pool(ed, v1, 2)
    assert pool_of(ed, v1)["size"] == 2
    assert metric(ed, "hatchery_snapshot_pool_ready") == 2
    claims0 = metric(ed, "hatchery_snapshot_pool_claims_total")

    probe = probe_cmd(f"tcp,{peer.addr},80", udp)
    s1, _ = run_command_session(ed, eid, f"cat .setup-done; {probe}; echo; echo mine > s1.txt")
    out1 = agent_output(ed, s1)
    assert "installed" in out1, out1
    results = json.loads(out1[out1.index("{"):out1.rindex("}") + 1])
    assert all(v.startswith("blocked:") for v in results.values()), results
    r1 = next(e for e in ed.all_events(s1) if e["type"] == "sandbox_ready")
    assert r1["boot_mode"] == f"environment {eid} v1 pool", r1
    # Refilled in the background.
    wait_pool(ed, v1, 2)
    s2, _ = run_command_session(ed, eid, "test -e s1.txt && echo S1-LEAKED; cat .setup-done")
    out2 = agent_output(ed, s2)
    assert "installed" in out2 and "S1-LEAKED" not in out2, out2
    r2 = next(e for e in ed.all_events(s2) if e["type"] == "sandbox_ready")
    assert r2["boot_mode"] == f"environment {eid} v1 pool" and r2["sandbox_id"] != r1["sandbox_id"], r2
    assert metric(ed, "hatchery_snapshot_pool_claims_total") - claims0 == 2
    print(f"pooled starts: {start_ms(ed, s1):.0f} ms, {start_ms(ed, s2):.0f} ms "
          f"(claim {r1['boot_ms']} ms, {r2['boot_ms']} ms)")

    # A rebuild: the new version is warmed, the superseded one's pool goes
    # (its snapshot is kept, the previous version).
    wait_pool(ed, v1, 2)
    old = set(pool_of(ed, v1)["sandbox_ids"])
    assert len(old) == 2, old
    v2 = build(ed, eid)[-1][1]["snapshot_id"]
    assert v2 != v1
    wait_pool(ed, v2, 2)
    assert pool_of(ed, v1) == {"snapshot_id": v1, "size": 0, "ready": 0, "sandbox_ids": []}
    wait_gone(ed, old)

    # A restart: the parked forks go with the old process, and the new
    # one fills the hot version's pool again before any session asks
    # (core_snapshot_pools); the superseded version's stays dropped.
    before = set(pool_of(ed, v2)["sandbox_ids"])
    ed.stop()
    wait_gone(ed, before)
    ed.start()
    after = set(wait_pool(ed, v2, 2)["sandbox_ids"])
    assert not after & before, (before, after)
    assert pool_of(ed, v1)["size"] == 0
    assert "snapshot pools kept across the restart" in ed.log(tail=None)

    # Deleting the environment drops the current version's pool with its
    # snapshot: nothing of it is left on the host.
    current = set(pool_of(ed, v2)["sandbox_ids"])
    assert len(current) == 2, current
    assert ed.request("DELETE", f"/v1/environments/{eid}").status == 204
    assert pool_of(ed, v2) is None
    wait_gone(ed, current)
    assert metric(ed, "hatchery_snapshot_pool_ready") == 0
