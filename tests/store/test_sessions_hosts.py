"""Sessions survive the loss of their host. Two hosts and a control plane
on a private PostgreSQL (tests/pg/pg.py), a shared snapshot store (a
directory both hosts use, as an NFS mount would be), a real git server
and the scripted model. Host A runs a session that is mid-run (checkpoints
every 2 s) and one that is idle (its idle snapshot in the shared store);
A is SIGKILLed (or, in the second run, SIGSTOPped past its lease and woken
once its sessions moved: its late writes are fenced). Then:

- B takes both sessions over (host_changed, the session epoch grows)
  once A's lease ran out;
- the running one resumes from its last checkpoint on B and completes,
  the idle one completes on B when a message arrives through the control
  plane;
- invariants: each session's event seqs are contiguous, event epochs
  never go back, every committed event was written under the epoch the
  session had then, no model step or command is logged twice, and the
  time from the kill to the resume is within 60 s (printed for
  docs/benchmarks.md).

Every daemon is checked for leftovers; A is restarted on its data dir so
that its orphaned shims are reconciled away."""

import json
import os
import shutil
import signal
import sys
import tempfile
import time

import pytest

HERE = os.path.dirname(__file__)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, os.path.join(HERE, "..", "pg"))
sys.path.insert(0, os.path.join(HERE, "..", "sessions"))

from gitserver import GitServer  # noqa: E402
from harness import arg, metric, wait_for  # noqa: E402
from pg import Postgres  # noqa: E402
from scripted_model import ScriptedModel  # noqa: E402
from sessions_support import DEMO_FILES, SCRIPTS, SessionDaemon  # noqa: E402
import hostnet  # noqa: E402
from test_environments import build  # noqa: E402
from test_hosts import host_netns, no_net_leftovers, sql, started, wait_warm, warm  # noqa: E402

# A short host lease, so that a lost host is noticed within seconds.
LEASE_TTL_S = 9
RESUME_BOUND_S = 60


@pytest.fixture(scope="module")
def pg():
    p = Postgres(db="hxsesshosts", fabric=True).start()
    yield p
    p.stop()


@pytest.fixture(scope="module")
def git_server(pg):
    # On the bridge (it is up with pg): the hosts fetch from their namespaces.
    g = GitServer(host=hostnet.GATEWAY).start()
    yield g
    g.stop()


@pytest.fixture(scope="module")
def model(pg):
    m = ScriptedModel(SCRIPTS, host=hostnet.GATEWAY).start()
    yield m
    m.stop()


@pytest.fixture
def shared():
    d = tempfile.mkdtemp(prefix="hxshared-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def gateway_files():
    """Prices and an upstream key for hosts whose sessions reach the model
    through the daemon's model gateway (budgets in the shared database)."""
    d = tempfile.mkdtemp(prefix="hxgwh-")
    prices = os.path.join(d, "prices.json")
    with open(prices, "w") as f:
        json.dump({"models": {"scripted": {"input_cents_per_mtok": 100, "output_cents_per_mtok": 400}}}, f)
    keyf = os.path.join(d, "upstream_key")
    with open(keyf, "w") as f:
        f.write("sk-upstream-hosts")
    yield prices, keyf
    shutil.rmtree(d, ignore_errors=True)


def host(pg, name, model, shared, restart_of=None, extra=(), gateway=None, gateway_control=None):
    """A host in a network namespace of its own (the one it ran in, when
    restarted on its data directory), on the bridge (hostnet.py)."""
    extra = ["--db", pg.fabric_dsn, "--host-id", name, "--role", "host", "--host-lease-ttl", str(LEASE_TTL_S),
             "--snapshot-store", f"shared:{shared}", "--sessions-checkpoint-interval", "2",
             "--sessions-idle-timeout", "3", "--pool-size", "0", *extra]
    net = None
    if restart_of is not None:
        net = ["--net-prefix", arg(restart_of.extra_args, "--net-prefix"),
               "--net-range", arg(restart_of.extra_args, "--net-range")]
    d = SessionDaemon(model.port, extra=extra, net_args=net, data_dir=restart_of.data_dir if restart_of else None,
                      netns=host_netns(name, restart_of), model_host=model.host, gateway=gateway,
                      gateway_control=gateway_control)
    return started(d)


def control_with_gateway(pg, name, model, gateway_files):
    """The control plane on the bridge (hosts reach it from their
    namespaces), running the model gateway: the upstream and its key are
    given to it alone."""
    c = SessionDaemon(model.port, model_host=model.host, gateway=gateway_files,
                      extra=["--db", pg.fabric_dsn, "--host-id", name, "--role", "control",
                             "--host-lease-ttl", str(LEASE_TTL_S), "--pool-size", "0"])
    c.addr = hostnet.GATEWAY
    return c.start()


def events_while_moving(d, sid):
    """The session's events, or None while its host is lost and nobody has
    taken it over yet (503 host_unreachable / host_lost, with Retry-After)."""
    r = d.request("GET", f"/v1/sessions/{sid}/events?limit=1000")
    if r.status == 503:
        assert r.error_code() in ("host_unreachable", "host_lost"), r
        assert "retry-after" in {k.lower() for k in r.headers}, r.headers
        return None
    assert r.status == 200, r
    return r.json()["events"]


def wait_moved_event(d, sid, type_, timeout):
    deadline = time.time() + timeout
    refused = 0
    while time.time() < deadline:
        evs = events_while_moving(d, sid)
        if evs is None:
            refused += 1
        else:
            for e in evs:
                if e["type"] == type_:
                    return e, refused
        time.sleep(0.25)
    raise AssertionError(f"no {type_} in {sid} within {timeout}s")


def session_row(pg, sid):
    h, e = sql(pg, f"SELECT host_id, epoch FROM sessions WHERE id = '{sid}'")[0]
    return h, int(e)


def assert_log_sound(pg, d, sid):
    evs = d.all_events(sid)
    assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1)), "gap or repeat in seqs"
    # Epochs never go back, and each event's epoch was the session's epoch
    # when it was committed: every event after a host_changed carries the
    # epoch that event announced, every one before it a lower one.
    eps = [int(e) for (e,) in sql(pg, f"SELECT epoch FROM session_events WHERE session_id = '{sid}' ORDER BY seq")]
    assert len(eps) == len(evs) and eps == sorted(eps), eps
    for e in evs:
        if e["type"] == "host_changed":
            assert eps[e["seq"] - 1] == e["epoch"], (e, eps)
    steps = [e["step"] for e in evs if e["type"] == "model_request"]
    assert steps == sorted(set(steps)), steps
    calls = [(e["call_id"], e["command"]) for e in evs if e["type"] == "command_run"]
    assert len(calls) == len(set(calls)), calls
    return evs


def assert_key_holders_cannot_pose_as_daemons(pg, c, h, sid):
    """The API key is every client's; the routes only daemons call want the
    deployment's daemon key too (kept in the shared database, made by the
    first daemon). Without it a client cannot charge a model call to a
    session through the control role's gateway, nor add events (here: an
    exhaustion that would end the session) to a session's log. With it,
    an event posted again under the same delivery key lands once."""
    sbx = h.session(sid)["sandbox_id"] or "sbx_none"
    call = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    r = c.request("POST", "/v1/model-gateway/v1/chat/completions", call,
                  headers={"X-Hatchery-Sandbox": sbx})
    assert r.status == 401 and r.json()["error"]["code"] == "unauthorized", r
    forged = {"kind": "exhausted", "scope": f"session:{sid}", "message": "forged"}
    for d in (h, c):
        r = d.request("POST", f"/v1/sessions/{sid}/model-events", forged,
                      headers={"X-Hatchery-Daemon-Key": "hxd_guess"})
        assert r.status == 401 and r.json()["error"]["code"] == "unauthorized", r
    # With the key every daemon read from the database, the route is
    # reached (and refuses a body it does not know, writing nothing).
    [[key]] = sql(pg, "SELECT value FROM core_secrets WHERE name = 'daemon_key'")
    assert key.startswith("hxd_") and len(key) == 68, key
    r = h.request("POST", f"/v1/sessions/{sid}/model-events", {"kind": "forged"},
                  headers={"X-Hatchery-Daemon-Key": key, "Idempotency-Key": "k0"})
    assert r.status == 400, r
    assert h.session(sid)["state"] == "idle"
    # An event sent again under its delivery key (the control role's
    # gateway retries a post whose answer it lost) is written once, through
    # either daemon; without a key the route refuses it.
    refused = {"kind": "refused", "api": "openai", "code": "upstream_unavailable", "message": "probe"}
    daemon = {"X-Hatchery-Daemon-Key": key}
    r = h.request("POST", f"/v1/sessions/{sid}/model-events", refused, headers=daemon)
    assert r.status == 400 and "idempotency-key" in r.json()["error"]["message"], r
    for d, k in ((h, "probe-1"), (c, "probe-1"), (h, "probe-1"), (h, "probe-2")):
        r = d.request("POST", f"/v1/sessions/{sid}/model-events", refused,
                      headers={**daemon, "Idempotency-Key": k})
        assert r.status == 204, r
    probes = [e for e in h.all_events(sid) if e["type"] == "model_refused" and e.get("message") == "probe"]
    assert len(probes) == 2, probes


@pytest.mark.parametrize("fault", ["sigkill", "sigstop"])
def test_sessions_of_a_lost_host_resume_on_another(pg, git_server, model, shared, fault, gateway_files):
    """sigkill: the host is gone. sigstop: the host is paused past its
    lease and woken once its sessions moved: every write it still tries
    for them is fenced (no event of its old epoch after the takeover), it
    kills its own sandboxes and stops driving them. The model is reached
    through the control role's model gateway: the hosts hold no upstream
    key and relay their sandboxes' calls to it; its budgets are in the
    shared database, so the spend before the move and after it is one
    account, and its events reach each session's log through the
    session's owner, the new one after the move."""
    # The control plane, with the session helpers (it routes them).
    c = control_with_gateway(pg, "ss-ctl", model, gateway_files)
    relay = f"http://{c.addr}:{c.port}"
    a = b = None
    try:
        a = host(pg, "ss-a", model, shared, gateway_control=relay)
        b = host(pg, "ss-b", model, shared, gateway_control=relay)
    except Exception:
        for d in (a, b):
            if d is not None:
                d.cleanup_sessions()
        c.cleanup()
        raise
    for d in (a, b):
        # No upstream, no upstream key on a host: only the control role has them.
        assert not any(x.startswith("--gateway-openai") or x.startswith("--gateway-upstream")
                       for x in d.extra_args), d.extra_args
        assert "model calls relayed to the control role's gateway" in open(d.log_path, errors="replace").read()
    a2 = None
    try:
        repo = git_server.add_repo(f"hosts-{fault}", DEMO_FILES)
        running = a.new_session(repo, "[script:slow] survive losing the host")
        idle = a.new_session(repo, "[script:ask] write the answer")
        assert session_row(pg, running)[0] == session_row(pg, idle)[0] == "ss-a"
        assert a.wait_event(running, "snapshot_taken")["purpose"] == "checkpoint"
        a.wait_event(running, "command_run", timeout=120)
        s = a.wait_state(idle, "idle")
        assert s["snapshot_id"], s
        assert_key_holders_cannot_pose_as_daemons(pg, c, a, idle)
        before = {sid: a.all_events(sid) for sid in (running, idle)}
        epochs = {sid: session_row(pg, sid)[1] for sid in (running, idle)}
        charged_before = {sid: a.session(sid)["spend"]["tokens"] for sid in (running, idle)}
        for sid in (running, idle):
            a.track_sandboxes(sid)
        if fault == "sigkill":
            a.crash()
        else:
            os.kill(a.proc.pid, signal.SIGSTOP)
        killed = time.time()

        # B takes both over once A's lease ran out; the running one is back
        # from its checkpoint on B.
        resumed, refused = wait_moved_event(c, running, "resumed_from_checkpoint", RESUME_BOUND_S)
        resumed_after = time.time() - killed
        assert resumed_after < RESUME_BOUND_S
        for sid in (running, idle):
            h, e = session_row(pg, sid)
            assert h == "ss-b" and e > epochs[sid], (sid, h, e)
        if fault == "sigstop":
            # Woken after the takeover: it finds its host lease and its
            # sessions gone, kills its sandboxes, writes nothing more.
            os.kill(a.proc.pid, signal.SIGCONT)
            wait_for(lambda: "killing this host's sandboxes" in open(a.log_path, errors="replace").read(),
                     timeout=30, what="the woken host giving its sandboxes up")
            a.wait_no_leftovers(timeout=30, net=False)
        s = c.wait_state(running, "completed", timeout=180)
        assert s["reason"] == "agent finished: done slowly", s
        # The idle one wakes on B when a message comes through the control
        # plane (routed to the session's new host).
        r = c.request("POST", f"/v1/sessions/{idle}/messages", {"text": "after-loss.md"})
        assert r.status == 202, r
        s = c.wait_state(idle, "completed", timeout=180)
        assert s["reason"] == "agent finished: wrote after-loss.md", s

        # Every gateway event reached an owner's log, none given up.
        assert metric(c, "hatchery_gateway_events_total", 'outcome="delivered"') > 0
        for outcome in ("refused", "timed_out", "owner_lost", "unknown_session"):
            assert metric(c, "hatchery_gateway_events_total", f'outcome="{outcome}"') == 0, outcome
        for sid in (running, idle):
            # One budget account across both hosts: the gateway's row in the
            # shared database holds what the session was charged on A and
            # on B, which is the session's own spend.
            spent = c.session(sid)["spend"]["tokens"]
            used = sql(pg, f"SELECT used_tokens FROM gateway_budgets WHERE scope = 'session:{sid}'")
            assert used == [[str(spent)]] and spent > charged_before[sid] > 0, (sid, used, spent, charged_before)
            evs = assert_log_sound(pg, c, sid)
            # Nothing acknowledged before the loss was lost or changed.
            assert evs[:len(before[sid])] == before[sid]
            changed = [e for e in evs if e["type"] == "host_changed"]
            assert len(changed) == 1 and changed[0]["from"] == "ss-a" and changed[0]["to"] == "ss-b", changed
            b.track_sandboxes(sid)
        assert resumed["lost_sandbox"] != resumed["sandbox_id"]
        print(f"{fault}: session resumed from its checkpoint {resumed_after:.1f}s after the fault "
              f"(lease TTL {LEASE_TTL_S}s; fork {resumed['resume_ms']} ms; {refused} reads answered 503 meanwhile)")
        # A's restart reconciles its orphaned sandboxes away and takes no
        # session back.
        a.stop()
        a2 = host(pg, "ss-a", model, shared, restart_of=a, gateway_control=relay)
        a2.created |= a.created
        a2.wait_no_leftovers(timeout=30, net=False)
        assert session_row(pg, running)[0] == "ss-b"
    finally:
        c.cleanup()
        if a.proc.poll() is None and fault == "sigstop":
            os.kill(a.proc.pid, signal.SIGCONT)
        if a2 is None and a.proc.poll() is not None:
            # Failed before A's restart: restart it so that its orphans go.
            a2 = host(pg, "ss-a", model, shared, restart_of=a, gateway_control=relay)
            a2.created |= a.created
        # A first: its session reads are forwarded to B, which must be up.
        # B is cleaned up even if A's cleanup finds leftovers.
        try:
            (a2 or a).cleanup_sessions()
        finally:
            b.cleanup_sessions()
    no_net_leftovers(a, b)
    left = [n for n in os.listdir(shared) if not n.startswith(".")]
    if fault == "sigkill" and left:
        # A host killed between publishing a checkpoint's image and
        # inserting its row leaves the image without a row; the orphan
        # sweep removes such images once they are STALE_AFTER (6 h) old,
        # since another host may still be about to insert its row. Only
        # that is allowed here: an image with a row was not cleaned up.
        ids = ", ".join(f"'{n}'" for n in left)
        rows = sql(pg, f"SELECT id FROM core_snapshots WHERE id IN ({ids})")
        assert rows == [], (left, rows)
        print(f"\nimages the kill left without a row (swept after 6 h): {left}")
    else:
        assert left == [], left


def test_control_spreads_one_tenants_sessions(pg, git_server, model, shared):
    """Placement of session starts. Host a has twice b's room, so by free
    room alone every session would start on a; a second session of the
    same tenant (`metadata.tenant`) starts on b instead, while another
    tenant's goes to the roomier a. The session's sandbox carries the
    session's metadata (that is what the control plane counts). A policy
    created through the control plane is read by both hosts, so the two
    sessions pinned to it start on either."""
    a = host(pg, "sp-a", model, shared, extra=["--max-sandboxes", "6"])
    b = host(pg, "sp-b", model, shared, extra=["--max-sandboxes", "3"])
    c = SessionDaemon(model.port, model_host=model.host, extra=["--db", pg.dsn, "--host-id", "sp-ctl", "--role",
                                                                "control", "--pool-size", "0"]).start()
    sids = []
    try:
        wait_warm(pg, ["sp-a", "sp-b"], "code-interpreter")
        # The control plane's data dir holds the API key: 0700, as a host's.
        assert os.stat(c.data_dir).st_mode & 0o777 == 0o700
        # Policies are shared: one created through the control plane (on
        # whichever host it forwards to) reads the same on every host, its
        # versions too, and sessions pin it wherever they are placed.
        r = c.request("POST", "/v1/policies", {"name": "shared", "rules": [{"id": "r", "effect": "deny"}]})
        assert r.status == 201, r
        pol = r.json()["id"]
        r = c.request("POST", f"/v1/policies/{pol}/versions",
                      {"name": "shared", "rules": [{"id": "all", "effect": "allow"}]})
        assert r.status == 201 and r.json()["version"] == 2, r
        for d in (a, b):
            got = d.request("GET", f"/v1/policies/{pol}/versions/1")
            assert got.status == 200 and got.json()["document"]["rules"][0]["effect"] == "deny", got
            assert d.request("GET", f"/v1/policies/{pol}").json()["version"] == 2
            assert [p["id"] for p in d.request("GET", "/v1/policies").json()["policies"]].count(pol) == 1
        assert sql(pg, f"SELECT count(*) FROM policy_versions WHERE policy_id = '{pol}'") == [["2"]]
        repo = git_server.add_repo("spread", DEMO_FILES)
        first = c.new_session(repo, "[script:slow] one", metadata={"tenant": "acme"}, policy_id=pol)
        sids.append(first)
        ready = c.wait_event(first, "sandbox_ready")
        sb = c.request("GET", f"/v1/sandboxes/{ready['sandbox_id']}").json()
        assert sb["metadata"] == {"tenant": "acme", "hatchery_session": first}, sb
        assert c.session(first)["metadata"] == {"tenant": "acme"}
        second = c.new_session(repo, "[script:slow] two", metadata={"tenant": "acme"}, policy_id=pol)
        sids.append(second)
        other = c.new_session(repo, "[script:slow] three", metadata={"tenant": "globex"})
        sids.append(other)
        placed = [session_row(pg, s)[0] for s in sids]
        assert placed == ["sp-a", "sp-b", "sp-a"], placed
        for sid in sids[:2]:
            view = c.session(sid)
            assert (view["policy_id"], view["policy_version"]) == (pol, 2), view
        for s in sids:
            c.wait_state(s, "completed", timeout=180)
            {"sp-a": a, "sp-b": b}[session_row(pg, s)[0]].track_sandboxes(s)
            assert_log_sound(pg, c, s)
    finally:
        c.cleanup()
        try:
            a.cleanup_sessions()
        finally:
            b.cleanup_sessions()
    no_net_leftovers(a, b)


def test_a_session_from_an_environment_goes_where_its_pool_is(pg, git_server, model, shared):
    """Placement of a session from an environment. Host b builds the
    environment (its snapshot goes to the shared store) and keeps a warm
    pool of it; a has twice b's room, so by free room alone every session
    would start on a. The first session through the control plane starts
    on b, claimed from the pool; with b's pool dropped, the second starts
    on a, which never had the snapshot: it restores it from the shared
    store. Both see the set-up's output and the same commit."""
    a = host(pg, "ep-a", model, shared, extra=["--max-sandboxes", "6"])
    b = host(pg, "ep-b", model, shared, extra=["--max-sandboxes", "3"])
    c = SessionDaemon(model.port, model_host=model.host, extra=["--db", pg.dsn, "--host-id", "ep-ctl", "--role",
                                                                "control", "--pool-size", "0"]).start()
    eid = None
    try:
        repo = git_server.add_repo("envplace", DEMO_FILES)
        r = c.request("POST", "/v1/environments", {"name": "placed", "repo": repo, "pool_size": 0,
                                                   "setup": "echo installed > .setup-done"})
        assert r.status == 201, r
        eid = r.json()["environment_id"]
        evs = build(b, eid)
        assert evs[-1][0] == "done", evs
        snap = evs[-1][1]["snapshot_id"]
        key = f"snapshot:{snap}"
        r = b.request("PUT", f"/v1/snapshots/{snap}/pool", {"size": 1})
        assert r.status == 200, r
        wait_for(lambda: key in warm(pg, "ep-b"), timeout=60, what="b reporting the environment's pool warm")
        assert key not in warm(pg, "ep-a")

        def start(expect_host, expect_mode):
            r = c.request("POST", "/v1/sessions", {"environment_id": eid, "task": "inspect",
                                                   "agent": {"kind": "command", "command": "cat .setup-done"}})
            assert r.status == 201, r
            sid = r.json()["session_id"]
            end = c.wait_state(sid, ("completed",), timeout=240)
            assert end["state"] == "completed", end
            assert session_row(pg, sid)[0] == expect_host
            d = {"ep-a": a, "ep-b": b}[expect_host]
            d.track_sandboxes(sid)
            events = c.all_events(sid)
            ready = next(e for e in events if e["type"] == "sandbox_ready")
            assert ready["boot_mode"] == f"environment {eid} v1 {expect_mode}", ready
            out = "".join(e["text"] for e in events if e["type"] == "agent_output")
            assert "installed" in out, out
            return next(e for e in events if e["type"] == "repo_checked_out")["commit"]

        first = start("ep-b", "pool")
        assert b.request("PUT", f"/v1/snapshots/{snap}/pool", {"size": 0}).status == 200
        wait_for(lambda: key not in warm(pg, "ep-b"), timeout=30, what="b no longer reporting the pool")
        assert start("ep-a", "fork") == first
    finally:
        try:
            if eid:
                c.request("DELETE", f"/v1/environments/{eid}")
            c.cleanup()
        finally:
            try:
                a.cleanup_sessions()
            finally:
                b.cleanup_sessions()
    no_net_leftovers(a, b)
