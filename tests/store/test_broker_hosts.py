"""No tool effect happens twice when a session's host is lost. Two hosts,
each in a network namespace of its own (tests/pg/hostnet.py), and a
control plane on one PostgreSQL; a shared snapshot store; a real git
server behind the push server the broker pushes to. A `command` agent
(tests/broker/pusher_agent.py) pushes its branch CALLS times through the
broker, one seq per push, asking again with the same seq until answered.
Host A is SIGKILLed while a push is at the git server; B takes the
session over and the agent runs on from its last checkpoint, so it asks
again for calls A's broker already ran, and for the one in flight.

Two placements of the broker. `host`: each host runs one; the call
record is in the shared database (and the session's log is shared too),
so B's broker finds A's calls: one with a result is answered as it was,
one A left mid-effect is resolved by asking the remote, never pushed
again. `control`: the control role runs the one broker and the hosts
relay to it (no credential on a host); A's death does not stop the push
it relayed, whose result reaches the log through B once B owns the
session. Checked from the log and the remote:

- every seq has exactly one `broker_effect_started` and one
  `broker_result`, and every answer the agent printed is the logged one;
- no commit was pushed twice, and only planned commits were pushed;
- a `done` push is on the remote exactly once, a `needs_review` one not;
- the session completes; its event seqs are contiguous and its epochs
  only grow (test_sessions_hosts.assert_log_sound)."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

HERE = os.path.dirname(__file__)
sys.path.insert(0, HERE)
for sub in ("integration", "pg", "sessions", "broker"):
    sys.path.insert(0, os.path.join(HERE, "..", sub))

import hostnet  # noqa: E402
from harness import BIN_DIR, wait_for  # noqa: E402
from broker_support import BrokerDaemon, add_repo  # noqa: E402
from forge import Forge  # noqa: E402
from gitserver import GitServer  # noqa: E402
from pg import Postgres  # noqa: E402
from pushserver import PushServer, pushes  # noqa: E402
from scripted_model import ScriptedModel  # noqa: E402
from sessions_support import SCRIPTS, SessionDaemon  # noqa: E402
from test_hosts import host_netns, no_net_leftovers, sql, started  # noqa: E402
from test_sessions_hosts import assert_log_sound, session_row  # noqa: E402

LEASE_TTL_S = 9
CALLS = 10
PUSHES_BEFORE_KILL = 4
BOUND_S = 240


@pytest.fixture(scope="module")
def pg():
    p = Postgres(db="hxbrokerhosts", fabric=True).start()
    yield p
    p.stop()


@pytest.fixture(scope="module")
def servers(pg):
    """What the hosts reach over the bridge: git, the push server, the
    forge and the scripted model."""
    g = GitServer(host=hostnet.GATEWAY).start()
    p = PushServer(g.root, host=hostnet.GATEWAY).start()
    f = Forge(host=hostnet.GATEWAY).start()
    m = ScriptedModel(SCRIPTS, host=hostnet.GATEWAY).start()
    yield g, p, f, m
    m.stop()
    f.stop()
    p.stop()
    g.stop()


def broker_host(pg, name, servers, shared, restart_of=None, control=None, anchors=None):
    """A host with a broker of its own (and the credentials), or, given
    the control plane's URL, one that relays its sandboxes' broker calls
    there and holds no credential. `anchors`: a directory outside the data
    dir where it anchors its chains' heads every second (NAME.jsonl)."""
    g, p, f, m = servers
    extra = ["--db", pg.fabric_dsn, "--host-id", name, "--role", "host", "--host-lease-ttl", str(LEASE_TTL_S),
             "--snapshot-store", f"shared:{shared}", "--sessions-checkpoint-interval", "2", "--pool-size", "0"]
    if anchors:
        # (A BrokerDaemon already anchors every second, with its hook.)
        extra += ["--audit-anchor-file", os.path.join(anchors, f"{name}.jsonl")]
        if control is not None:
            extra += ["--audit-anchor-interval", "1"]
    if restart_of is not None:
        for flag in ("--net-prefix", "--net-range"):
            extra += [flag, restart_of.extra_args[restart_of.extra_args.index(flag) + 1]]
    kw = dict(data_dir=restart_of.data_dir if restart_of else None, netns=host_netns(name, restart_of),
              model_host=m.host)
    if control is not None:
        d = SessionDaemon(m.port, extra=[*extra, "--broker-control-url", control], **kw)
    else:
        d = BrokerDaemon(m.port, g, p, f, extra=extra, **kw)
    return started(d)


def broker_control(pg, servers, host_id="bh-ctl"):
    """The control plane on the bridge (hosts reach it from their
    namespaces), running the broker for the hosts: the git credential and
    the forge token are given to it alone."""
    g, p, f, m = servers
    c = BrokerDaemon(m.port, g, p, f, model_host=m.host,
                     extra=["--db", pg.fabric_dsn, "--host-id", host_id, "--role", "control", "--broker-for-hosts",
                            "--host-lease-ttl", str(LEASE_TTL_S), "--pool-size", "0"])
    c.addr = hostnet.GATEWAY
    return c.start()


def anchored(directory, host):
    path = os.path.join(directory, f"{host}.jsonl")
    if not os.path.exists(path):
        return []
    return [json.loads(line) for line in open(path) if line.strip()]


def wait_completed(c, sid, timeout):
    """The session's state through the control plane until it completes;
    while its host is lost and nobody has taken it over yet the answer is
    503 (host_unreachable or host_lost, with Retry-After)."""
    deadline = time.time() + timeout
    s = None
    while time.time() < deadline:
        r = c.request("GET", f"/v1/sessions/{sid}")
        if r.status == 503:
            assert r.error_code() in ("host_unreachable", "host_lost"), r
        else:
            assert r.status == 200, r
            s = r.json()
            if s["state"] == "completed":
                return s
            if s["state"] in ("failed", "cancelled"):
                r = c.request("GET", f"/v1/sessions/{sid}/events?limit=1000")
                tail = r.json()["events"][-12:] if r.status == 200 else r
                raise AssertionError(f"session {s['state']}: {json.dumps(s)[:2000]}; last events: {tail}")
        time.sleep(0.25)
    raise AssertionError(f"not completed in {timeout}s: {s}")


def broker_events(evs, type_):
    out = {}
    for e in evs:
        if e["type"] == type_:
            out.setdefault(e["call_seq"], []).append(e)
    return out


def assert_broker_writes_are_the_daemons(pg, c, owner, sid):
    """A client holding the API key cannot reach the control role's broker
    as if it were a host, nor write broker events or open approvals in a
    session's log; with the daemon key, a write posted again under its
    delivery key (through the owner or the control plane) lands once."""
    r = c.request("POST", "/v1/broker-relay/v1/invoke", {"seq": 1, "tool": "noop", "args": {}},
                  headers={"X-Hatchery-Sandbox": "sbx_guess"})
    assert r.status == 401 and r.json()["error"]["code"] == "unauthorized", r
    forged = {"events": [{"type": "broker_result", "call_seq": 999, "tool": "git_push", "status": "done",
                          "output": "{}"}]}
    for d in (owner, c):
        r = d.request("POST", f"/v1/sessions/{sid}/broker-events", forged,
                      headers={"X-Hatchery-Daemon-Key": "hxd_guess", "Idempotency-Key": "f1"})
        assert r.status == 401 and r.json()["error"]["code"] == "unauthorized", r
    [[key]] = sql(pg, "SELECT value FROM core_secrets WHERE name = 'daemon_key'")
    daemon = {"X-Hatchery-Daemon-Key": key}
    r = owner.request("POST", f"/v1/sessions/{sid}/broker-events", forged, headers=daemon)
    assert r.status == 400 and "idempotency-key" in r.json()["error"]["message"], r
    bad = {"events": [{"type": "error", "code": "x", "message": "forged"}]}
    r = owner.request("POST", f"/v1/sessions/{sid}/broker-events", bad, headers={**daemon, "Idempotency-Key": "f2"})
    assert r.status == 400, r
    answers = []
    for d in (owner, c, owner):
        r = d.request("POST", f"/v1/sessions/{sid}/broker-events", forged, headers={**daemon, "Idempotency-Key": "f3"})
        assert r.status == 200, r
        answers.append(r.json())
    assert answers[0]["repeat"] is False and len(answers[0]["seqs"]) == 1, answers
    assert [a["repeat"] for a in answers[1:]] == [True, True], answers
    probes = [e for e in c.all_events(sid) if e["type"] == "broker_result" and e["call_seq"] == 999]
    assert len(probes) == 1, probes
    # The broker's rows travel with its events and commit in the owner's
    # transaction: one for another session's call is refused, and one
    # that declines (no such call to set a seq on) writes no event either.
    before = len(c.all_events(sid))
    other = dict(forged, joined={"set_ref": {"which": "result", "session_id": "ses_other", "seq": 999}})
    r = owner.request("POST", f"/v1/sessions/{sid}/broker-events", other, headers={**daemon, "Idempotency-Key": "f4"})
    assert r.status == 400 and "ses_other" in r.json()["error"]["message"], r
    declining = dict(forged, joined={"set_ref": {"which": "result", "session_id": sid, "seq": 999}})
    r = owner.request("POST", f"/v1/sessions/{sid}/broker-events", declining,
                      headers={**daemon, "Idempotency-Key": "f5"})
    assert r.status == 200 and r.json() == {"seqs": [], "repeat": False, "declined": True}, r
    assert len(c.all_events(sid)) == before


def assert_rows_match_the_log(pg, sid, evs):
    """A call's row names the seqs of its `broker_call` and `broker_result`
    events, and those events are in the log: the row and the events commit
    in one transaction (issue 32), on the control role through the owner."""
    by_seq = {e["seq"]: e for e in evs}
    rows = sql(pg, f"SELECT seq, event_seq, result_event_seq FROM broker_calls WHERE session_id = '{sid}'")
    assert len(rows) == CALLS, rows
    for seq, ev, res in rows:
        assert ev and by_seq[int(ev)]["type"] == "broker_call", (seq, ev)
        assert by_seq[int(ev)]["call_seq"] == int(seq), (seq, ev)
        assert res and by_seq[int(res)]["type"] == "broker_result", (seq, res)
        assert by_seq[int(res)]["call_seq"] == int(seq), (seq, res)


@pytest.mark.parametrize("broker_on", ["host", "control"])
def test_broker_calls_of_a_lost_host_are_never_run_twice(pg, servers, broker_on):
    """host: each host runs a broker (A's dies with it). control: the
    control role runs the one broker and the hosts relay to it, holding no
    credential; A's death does not stop the push it was relaying, whose
    events reach the log through the session's next owner."""
    g, push_server, f, m = servers
    shared = tempfile.mkdtemp(prefix="hxshared-")
    files = {"pusher.py": open(os.path.join(HERE, "..", "broker", "pusher_agent.py")).read(), "README.md": "x\n"}
    repo, bare = add_repo(g, f"hostpush-{broker_on}", files)
    c2 = None
    if broker_on == "control":
        c = broker_control(pg, servers)
        relay = f"http://{c.addr}:{c.port}"
        # A second control process running the broker on the same record
        # (the hosts relay to the first): it must leave the calls the
        # first is running alone (their runner's heartbeat is fresh).
        c2 = broker_control(pg, servers, host_id="bh-ctl2")
    else:
        c = SessionDaemon(m.port, model_host=m.host, extra=["--db", pg.dsn, "--host-id", "bh-ctl", "--role",
                                                            "control", "--host-lease-ttl", str(LEASE_TTL_S),
                                                            "--pool-size", "0"]).start()
        relay = None
    # Every host anchors the chains it writes, also one that relays its
    # broker calls to the control role (issue 37 item 2).
    anchors = tempfile.mkdtemp(prefix="hxanchors-")
    a = broker_host(pg, "bh-a", servers, shared, control=relay, anchors=anchors)
    b = broker_host(pg, "bh-b", servers, shared, control=relay, anchors=anchors)
    if relay:
        for d in (a, b):
            assert not any(x.startswith("--broker-git") or x.startswith("--broker-github")
                           for x in d.extra_args), d.extra_args
    a2 = None
    push_server.receive_delay = 0.4
    try:
        sid = a.new_session(repo, "push through a host loss",
                            agent={"kind": "command", "command": f"python3 pusher.py {CALLS}"})
        assert session_row(pg, sid)[0] == "bh-a"
        a.wait_state(sid, "running")
        a.wait_event(sid, "snapshot_taken")
        deadline = time.time() + 120
        while len(push_server.receive_started) < PUSHES_BEFORE_KILL and time.time() < deadline:
            time.sleep(0.02)
        # The next push reaches the git server: kill A while it is there.
        seen = len(push_server.receive_started)
        while len(push_server.receive_started) == seen and time.time() < deadline:
            time.sleep(0.005)
        time.sleep(0.1)
        a.track_sandboxes(sid)
        a.crash()
        killed = time.time()
        push_server.receive_delay = 0.0
        s = wait_completed(c, sid, BOUND_S)
        assert session_row(pg, sid)[0] == "bh-b", s
        took = time.time() - killed

        evs = assert_log_sound(pg, c, sid)
        assert any(e["type"] == "host_changed" for e in evs)
        started_ = broker_events(evs, "broker_effect_started")
        results = broker_events(evs, "broker_result")
        assert sorted(results) == list(range(1, CALLS + 1)), sorted(results)
        for seq in range(1, CALLS + 1):
            assert len(results[seq]) == 1, (seq, results[seq])
            assert len(started_.get(seq, [])) == 1, (seq, started_.get(seq))
        # The remote: nothing pushed twice, nothing unplanned.
        remote = [p[1] for p in pushes(bare) if p[2] == f"refs/heads/hatchery/{sid}"]
        assert len(remote) == len(set(remote)), remote
        planned = {json.loads(e[0]["detail"])["commit"]: seq for seq, e in started_.items()}
        assert set(remote) <= set(planned), (remote, planned)
        statuses = {}
        for seq, (r,) in results.items():
            statuses[r["status"]] = statuses.get(r["status"], 0) + 1
            commit = json.loads(started_[seq][0]["detail"])["commit"]
            if r["status"] == "done":
                assert remote.count(commit) == 1, (seq, r)
            else:
                assert r["status"] == "needs_review" and commit not in remote, (seq, r)
        # Every answer the agent printed (before and after the move, the
        # repeated ones included) is the logged result of that seq.
        told = 0
        for e in evs:
            if e["type"] == "agent_output":
                for line in e["text"].splitlines():
                    if line.startswith("PUSH "):
                        _, seq, js = line.split(" ", 2)
                        r, logged = json.loads(js), results[int(seq)][0]
                        assert r["status"] == logged["status"], (seq, r, logged)
                        assert r["output"] == json.loads(logged["output"]), (seq, r, logged)
                        told += 1
        assert told >= CALLS
        assert_rows_match_the_log(pg, sid, evs)
        if relay:
            # The broker outlived the host: every push is known done, and
            # its record (on the control role) says so too.
            assert statuses == {"done": CALLS}, statuses
            calls = c.calls(sid)
            assert [(x["seq"], x["status"]) for x in calls] == [(i, "done") for i in range(1, CALLS + 1)], calls
            for d in (a, b):
                assert not os.path.exists(os.path.join(d.data_dir, "broker.db")), d.data_dir
            assert_broker_writes_are_the_daemons(pg, c, b, sid)
            # The second broker process sees the same record, and resolved
            # none of the first one's calls as stopped mid-effect.
            assert [(x["seq"], x["status"]) for x in c2.calls(sid)] == [(i, "done") for i in range(1, CALLS + 1)]
            assert "resolved after a restart" not in open(c2.log_path, errors="replace").read()
        else:
            assert statuses.get("done", 0) >= CALLS - 1, statuses
        resumed = [e for e in evs if e["type"] == "resumed_from_checkpoint"]
        assert len(resumed) == 1, resumed
        # Both hosts anchored the session's chain while they owned it (A
        # until it died, B to its last event), outside their data dirs;
        # every anchored head is still in the chain.
        took_over = resumed[0]["seq"]
        wait_for(lambda: any(x["chain"] == sid and x["seq"] >= took_over for x in anchored(anchors, "bh-b")),
                 timeout=30, what="B's anchor of the session's events after it took the session over")
        assert any(x["chain"] == sid for x in anchored(anchors, "bh-a")), os.listdir(anchors)
        for name in ("bh-a", "bh-b"):
            v = subprocess.run([os.path.join(BIN_DIR, "hatchery"), "audit", "verify", "--db", pg.dsn,
                                "--anchors", os.path.join(anchors, f"{name}.jsonl"), sid],
                               capture_output=True, text=True, timeout=60)
            assert v.returncode == 0, (name, v.stdout, v.stderr)
        print(f"broker across a host loss: {statuses}, {len(remote)} pushes, {told} answers printed, "
              f"completed {took:.1f}s after the kill")
        b.track_sandboxes(sid)
        # A's restart reconciles its orphans away.
        a2 = broker_host(pg, "bh-a", servers, shared, restart_of=a, control=relay)
        a2.created |= a.created
        a2.wait_no_leftovers(timeout=30, net=False)
    finally:
        push_server.receive_delay = 0.0
        c.cleanup()
        if c2 is not None:
            c2.cleanup()
        if a2 is None and a.proc.poll() is not None:
            a2 = broker_host(pg, "bh-a", servers, shared, restart_of=a, control=relay)
            a2.created |= a.created
        try:
            (a2 or a).cleanup_sessions()
        finally:
            b.cleanup_sessions()
            for d in (a, b):
                if getattr(d, "secrets_dir", None):
                    shutil.rmtree(d.secrets_dir, ignore_errors=True)
    no_net_leftovers(a, b)
    assert [n for n in os.listdir(shared) if not n.startswith(".")] == [], os.listdir(shared)
    shutil.rmtree(shared, ignore_errors=True)
    shutil.rmtree(anchors, ignore_errors=True)
