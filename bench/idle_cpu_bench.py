#!/usr/bin/env python3
"""`make bench`: what an idle sandbox costs in CPU. The Sentry of this
runsc (0.0~20240729, systrap) wakes every 400 µs even when the guest does
nothing (hatchery-runtime-gvisor's freezer.rs), so warm pooled sandboxes
are parked (their freezer cgroup FROZEN) until claimed. Measured from each
sandbox's host cgroup (cpuacct.usage) over W seconds, in the same run:
pooled sandboxes parked (as the daemon leaves them), the same sandboxes
thawed by hand (what they cost before parking), claimed sandboxes that sit
idle with idle parking off (`--idle-park-ms 0`, running) and on (parked
after `--idle-park-ms`, hatchery-core idle.rs). Also what parking costs the
next request: an exec on a parked sandbox against one on a running one."""

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../tests/integration"))
from cgroups import cpu_ns, parked_within  # noqa: E402
from cgroups import freezer as state  # noqa: E402
from harness import Daemon, metric, wait_for  # noqa: E402

N = 4
W = 10.0


def ms_per_s(ids):
    a = {s: cpu_ns(s) for s in ids}
    t = time.monotonic()
    time.sleep(W)
    dt = time.monotonic() - t
    return [(cpu_ns(s) - a[s]) / 1e6 / dt for s in ids]


def row(name, xs):
    return f"| {name} | {len(xs)} | {statistics.median(xs):.2f} | {max(xs):.2f} | {statistics.mean(xs) * 100 / 1000:.2f} |"


PARK_MS = 1000
EXECS = 20


def exec_ms(d, sid):
    t = time.monotonic()
    assert d.exec(sid, "true")["exit_code"] == 0
    return (time.monotonic() - t) * 1000


def parking(d):
    """Claimed sandboxes on a daemon that parks them: their idle CPU, and
    the exec that follows a park against one that follows an exec."""
    claimed = [d.create(ttl_seconds=300) for _ in range(N)]
    assert all(parked_within(s, 30) for s in claimed)
    idle = ms_per_s(claimed)
    after_park, running = [], []
    sid = claimed[0]
    for _ in range(EXECS):
        assert parked_within(sid, 30)
        after_park.append(exec_ms(d, sid))
        running.append(exec_ms(d, sid))
    return idle, after_park, running


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main():
    d = Daemon(extra_args=["--pool-size", str(N), "--idle-park-ms", "0"]).start()
    try:
        wait_for(lambda: metric(d, "hatchery_pool_ready") == N, timeout=300, what="the pool fill")
        pooled = sorted(n for n in os.listdir(os.path.join(d.data_dir, "sandboxes")) if n.startswith("sbx_"))
        assert all(state(s) == "FROZEN" for s in pooled), [state(s) for s in pooled]
        parked = ms_per_s(pooled)
        for s in pooled:
            state(s, "THAWED")
        time.sleep(2)
        thawed = ms_per_s(pooled)
        for s in pooled:
            state(s, "FROZEN")
        claimed = []
        for _ in range(N):
            r = d.request("POST", "/v1/sandboxes", {"ttl_seconds": 300})
            assert r.status == 201, r
            claimed.append(r.json()["id"])
            d.created.add(claimed[-1])
        time.sleep(3)
        idle = ms_per_s(claimed)
    finally:
        d.cleanup()
    d = Daemon(extra_args=["--pool-size", "0", "--idle-park-ms", str(PARK_MS)]).start()
    try:
        idle_parked, after_park, running = parking(d)
        load = open("/proc/loadavg").read().split()[:3]
        print(f"\nIdle sandbox CPU, {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, W={W:.0f} s, load {' '.join(load)}\n")
        print("| sandboxes | n | p50 ms CPU per s | max | cores per 100 sandboxes |")
        print("|---|---|---|---|---|")
        print(row("pooled, parked (frozen; the daemon's state)", parked))
        print(row("pooled, thawed by hand (before parking)", thawed))
        print(row("claimed, idle, parking off (running)", idle))
        print(row(f"claimed, idle, parked (--idle-park-ms {PARK_MS})", idle_parked))
        print(f"\nexec `true` (n={EXECS} each, one sandbox, alternating): on a parked sandbox "
              f"p50 {statistics.median(after_park):.1f} ms p99 {pct(after_park, 0.99):.1f} ms; "
              f"right after another exec p50 {statistics.median(running):.1f} ms "
              f"p99 {pct(running, 0.99):.1f} ms; ratio of p50s "
              f"{statistics.median(after_park) / statistics.median(running):.2f}")
    finally:
        d.cleanup()


if __name__ == "__main__":
    main()
