#!/usr/bin/env python3
"""`make bench`: what an idle sandbox costs in CPU. The Sentry of this
runsc (0.0~20240729, systrap) wakes every 400 µs even when the guest does
nothing (hatchery-runtime-gvisor's freezer.rs), so warm pooled sandboxes
are parked (their freezer cgroup FROZEN) until claimed. Measured from each
sandbox's host cgroup (cpuacct.usage) over W seconds, in the same run:
pooled sandboxes parked (as the daemon leaves them), the same sandboxes
thawed by hand (what they cost before parking), and claimed sandboxes
that sit idle (running, not parkable: they serve a caller)."""

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../tests/integration"))
from harness import Daemon, metric, wait_for  # noqa: E402

N = 4
W = 10.0


def cpu_ns(sid):
    with open(f"/sys/fs/cgroup/cpuacct/{sid}/cpuacct.usage") as f:
        return int(f.read())


def ms_per_s(ids):
    a = {s: cpu_ns(s) for s in ids}
    t = time.monotonic()
    time.sleep(W)
    dt = time.monotonic() - t
    return [(cpu_ns(s) - a[s]) / 1e6 / dt for s in ids]


def state(sid, v=None):
    p = f"/sys/fs/cgroup/freezer/{sid}/freezer.state"
    if v:
        with open(p, "w") as f:
            f.write(v)
    with open(p) as f:
        return f.read().strip()


def row(name, xs):
    return f"| {name} | {len(xs)} | {statistics.median(xs):.2f} | {max(xs):.2f} | {statistics.mean(xs) * 100 / 1000:.2f} |"


def main():
    d = Daemon(extra_args=["--pool-size", str(N)]).start()
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
        load = open("/proc/loadavg").read().split()[:3]
        print(f"\nIdle sandbox CPU, {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, W={W:.0f} s, load {' '.join(load)}\n")
        print("| sandboxes | n | p50 ms CPU per s | max | cores per 100 sandboxes |")
        print("|---|---|---|---|---|")
        print(row("pooled, parked (frozen; the daemon's state)", parked))
        print(row("pooled, thawed by hand (before parking)", thawed))
        print(row("claimed, idle (running)", idle))
    finally:
        d.cleanup()


if __name__ == "__main__":
    main()
