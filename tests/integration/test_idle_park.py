"""Idle parking (hatchery-core idle.rs): a claimed sandbox that nobody uses
is stopped whole (its freezer cgroup FROZEN, no CPU at all) and the next
request runs it again; a sandbox with anything of the user's running in it
(a background process, a daemon a command left behind, a run in progress,
a terminal) is never parked. Real runsc sandboxes; the cgroups are cgroup
v1's, read on the host. The daemon parks after 600 ms here (3 s by
default) so each wait stays short."""

import threading
import time

import pytest

from cgroups import cpu_ns, freezer, parked_within
from harness import Daemon, metric, wait_for

PARK_MS = 600
ARGS = ["--pool-size", "0", "--idle-park-ms", str(PARK_MS), "--max-ttl", "600"]


def parked_by(d, sid, seconds=10):
    """`sid` FROZEN and the daemon done parking it (its gauge counts it:
    only for a test whose sandbox is the only one parked). The freezer
    reads FROZEN a moment before the daemon records the park; a request in
    that moment finds the sandbox not parked yet, the parker sees the
    request and thaws it itself, and no unpark is counted (CI, ci11)."""
    if not parked_within(sid, seconds):
        return False
    wait_for(lambda: metric(d, "hatchery_sandboxes_idle_parked") >= 1, timeout=seconds,
             what="the daemon recording the park")
    return True


def stays_running(sid, seconds):
    """True if `sid` was never FROZEN during `seconds` (sampled)."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        if freezer(sid) != "THAWED":
            return False
        time.sleep(0.05)
    return True


@pytest.fixture(scope="module")
def d():
    d = Daemon(extra_args=ARGS).start()
    yield d
    d.cleanup()


def test_an_unused_sandbox_is_parked_and_costs_nothing_until_used(d):
    sid = d.create(ttl_seconds=300)
    assert freezer(sid) == "THAWED"
    assert parked_by(d, sid), "an idle sandbox was not parked"
    before = cpu_ns(sid)
    time.sleep(1.5)
    # Frozen tasks do not run: not a nanosecond (an idle running Sentry of
    # this runsc takes some 50 ms in 1.5 s).
    assert cpu_ns(sid) == before, "a parked sandbox used CPU"
    assert metric(d, "hatchery_sandboxes_idle_parked") >= 1
    # Every kind of request runs it again first, and is served.
    t0 = time.time()
    assert d.exec(sid, "echo hi")["stdout"] == "hi\n"
    first_ms = (time.time() - t0) * 1000
    assert parked_by(d, sid)
    r = d.put_file(sid, "/tmp/a", b"x")
    assert r.status in (200, 204), r
    assert parked_by(d, sid)
    assert d.get_file(sid, "/tmp/a").body == b"x"
    assert parked_by(d, sid)
    r = d.request("POST", f"/v1/sandboxes/{sid}/code", {"code": "1+1"})
    assert r.status == 200 and "2" in r.body.decode(), r
    assert metric(d, "hatchery_idle_unparks_total") >= 4
    # The first request after a park is not slowed much by it.
    assert first_ms < 2000, first_ms


def test_background_work_keeps_a_sandbox_running(d):
    sid = d.create(ttl_seconds=300)
    # A daemon a finished command left behind: its output file must keep
    # growing, which a parked guest could not do.
    d.exec(sid, "nohup sh -c 'while true; do date +%s%N >> /tmp/ticks; sleep 0.2; done' "
                ">/dev/null 2>&1 &")
    assert stays_running(sid, PARK_MS / 1000 * 4), "parked with a background job running"
    n = len(d.get_file(sid, "/tmp/ticks").body.splitlines())
    assert n >= 8, n
    d.exec(sid, "pkill -f 'date +%s%N' ; pkill -f ticks ; true")
    assert parked_within(sid, 10), "not parked once the job ended"


def test_a_long_run_and_a_child_of_the_interpreter_keep_it_running(d):
    sid = d.create(ttl_seconds=300)
    done = {}

    def run():
        done["r"] = d.request("POST", f"/v1/sandboxes/{sid}/code",
                              {"code": "import time; time.sleep(3); print('slept')"})

    t = threading.Thread(target=run)
    t.start()
    assert stays_running(sid, 2.5), "parked during a run"
    t.join(30)
    assert done["r"].status == 200 and "slept" in done["r"].body.decode(), done["r"]
    # A child the interpreter started and left running is the user's.
    r = d.request("POST", f"/v1/sandboxes/{sid}/code",
                  {"code": "import subprocess; p = subprocess.Popen(['sleep', '30'])"})
    assert r.status == 200, r
    assert stays_running(sid, PARK_MS / 1000 * 4), "parked with the interpreter's child alive"
    d.request("POST", f"/v1/sandboxes/{sid}/code", {"code": "p.kill(); p.wait()"})
    assert parked_within(sid, 10)


def test_a_parked_sandbox_snapshots_forks_expires_and_tears_down(d):
    sid = d.create(ttl_seconds=300)
    d.exec(sid, "echo kept > /tmp/k")
    assert parked_within(sid, 10)
    r = d.request("POST", f"/v1/sandboxes/{sid}/snapshots", {"retention_seconds": 600})
    assert r.status == 201, r
    snap = r.json()["id"]
    r = d.request("POST", f"/v1/snapshots/{snap}/fork", {"count": 1})
    assert r.status == 201, r
    fork = r.json()["sandboxes"][0]["id"]
    d.created.add(fork)
    assert d.exec(fork, "cat /tmp/k")["stdout"] == "kept\n"
    # The TTL of a parked sandbox still ends it, and its teardown (which
    # must thaw it first) leaves nothing: the fixture's leak check.
    short = d.create(ttl_seconds=3)
    assert parked_within(short, 10)
    wait_for(lambda: d.request("GET", f"/v1/sandboxes/{short}").json().get("state") != "running",
             timeout=30, what="the TTL of a parked sandbox")
    d.request("DELETE", f"/v1/snapshots/{snap}")


def test_a_daemon_crash_and_restart_readopts_a_parked_sandbox():
    d = Daemon(extra_args=ARGS).start()
    d2 = None
    try:
        sid = d.create(ttl_seconds=300)
        assert parked_within(sid, 10)
        d.crash()
        d2 = Daemon(extra_args=d.extra_args, data_dir=d.data_dir).start()
        d2.created |= d.created
        assert d2.request("GET", f"/v1/sandboxes/{sid}").json()["state"] == "running"
        assert d2.exec(sid, "echo back")["stdout"] == "back\n"
    finally:
        (d2 or d).cleanup()
