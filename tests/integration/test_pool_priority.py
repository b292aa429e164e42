"""Issue 34 item 4: a pool refill never takes CPU from sandboxes in use.
A pooled sandbox is restored with the least CPU weight (its host cgroup's
cpu.shares is 2) and gets the normal weight (1024) the moment it is
claimed; the refill that follows starts low again. Once warm, a pooled
sandbox waits parked (its freezer cgroup FROZEN): it uses no CPU at all,
where an idle Sentry of this runsc otherwise burns about 3 % of a core
(hatchery-runtime-gvisor's freezer.rs). Real runsc sandboxes; the cgroups
are cgroup v1's, read on the host."""

import os
import time

from cgroups import cpu_ns, freezer
from harness import Daemon, metric, wait_for

SHARES = "/sys/fs/cgroup/cpu/{}/cpu.shares"


def shares(sid):
    with open(SHARES.format(sid)) as f:
        return int(f.read())


def sandboxes_of(d):
    """This daemon's sandboxes (their bundles in its data dir): other
    suites' daemons may run beside it."""
    return sorted(n for n in os.listdir(os.path.join(d.data_dir, "sandboxes")) if n.startswith("sbx_"))


def test_refills_run_at_the_least_cpu_weight_until_claimed():
    d = Daemon(extra_args=["--pool-size", "2"]).start()
    try:
        wait_for(lambda: metric(d, "hatchery_pool_ready") == 2, timeout=120, what="the pool fill")
        ids = sandboxes_of(d)
        assert len(ids) == 2, ids
        assert [shares(i) for i in ids] == [2, 2], "refills restore at the least weight"
        assert [freezer(i) for i in ids] == ["FROZEN", "FROZEN"], "warm pooled sandboxes wait parked"
        before = [cpu_ns(i) for i in ids]
        time.sleep(3)
        # Frozen tasks do not run: not a nanosecond of CPU (an idle running
        # Sentry takes some 100 ms in 3 s).
        assert [cpu_ns(i) for i in ids] == before, "a parked sandbox uses no CPU"
        r = d.request("POST", "/v1/sandboxes", {"ttl_seconds": 120})
        assert r.status == 201 and r.json()["boot_mode"] == "pool", r
        sid = r.json()["id"]
        d.created.add(sid)
        assert sid in ids
        assert shares(sid) == 1024, "a claimed sandbox has the normal weight"
        assert freezer(sid) == "THAWED", "a claim unparks it"
        assert d.exec(sid, "echo hi")["stdout"] == "hi\n"
        wait_for(lambda: metric(d, "hatchery_pool_ready") == 2, timeout=120, what="the refill")
        refill = [i for i in sandboxes_of(d) if i not in ids]
        assert len(refill) == 1, refill
        assert shares(refill[0]) == 2
        assert freezer(refill[0]) == "FROZEN"
        assert shares(sid) == 1024
        # The graceful stop destroys the parked pool, and cleanup's leak
        # check finds nothing left: teardown thaws a parked sandbox first.
    finally:
        d.cleanup()
