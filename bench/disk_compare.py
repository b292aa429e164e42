#!/usr/bin/env python3
"""Before/after figures for a change to the sandbox disk: create latency
(restore, no pool), a 200 MiB write inside the guest, and PSS of idle
sandboxes, for two builds, runs alternated so both see the same machine.

    python3 bench/disk_compare.py BEFORE_BIN_DIR AFTER_BIN_DIR [ROUNDS]

Each round starts a daemon (--pool-size 0) per build, waits for its bake,
then N=15 creates + deletes, 3 writes, 8 idle sandboxes. Bounded; loopback
only."""

import json
import os
import subprocess
import sys
import time

N = 15


def one(bin_dir):
    os.environ["HATCHERY_BIN_DIR"] = bin_dir
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../tests/integration"))
    sys.path.insert(0, os.path.dirname(__file__))
    from bench import metric, pct, sandbox_pss_mb, wait_for  # noqa: E402
    from harness import Daemon  # noqa: E402

    d = Daemon(extra_args=["--max-sandboxes", "40", "--pool-size", "0"]).start()
    try:
        wait_for(lambda: metric(d, "hatchery_template_images_baked_total") >= 1, timeout=300)
        lat = []
        for _ in range(N):
            t = time.perf_counter()
            sid = d.create(ttl_seconds=120)
            lat.append((time.perf_counter() - t) * 1000)
            d.delete(sid)
        sid = d.create(ttl_seconds=300)
        writes = []
        for i in range(3):
            t = time.perf_counter()
            r = d.exec(sid, f"dd if=/dev/zero of=/root/w{i} bs=1M count=200 2>&1 | tail -1; rm -f /root/w{i}",
                       timeout_seconds=60)
            writes.append((time.perf_counter() - t) * 1000)
            assert "copied" in r["stdout"], r
        d.delete(sid)
        idle = [d.create(ttl_seconds=300) for _ in range(8)]
        time.sleep(2)
        pss = [sandbox_pss_mb(s) for s in idle]
        for s in idle:
            d.delete(s)
        return {"create_p50": pct(lat, 50), "create_p99": pct(lat, 99),
                "write_200m_p50": pct(writes, 50), "pss_mb_mean": sum(pss) / len(pss)}
    finally:
        d.cleanup()


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "--one":
        print(json.dumps(one(sys.argv[2])))
        return
    before, after = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    rows = []
    for r in range(rounds):
        for name, b in (("before", before), ("after", after)):
            out = subprocess.run([sys.executable, __file__, "--one", b], capture_output=True, text=True,
                                 timeout=900)
            if out.returncode != 0:
                sys.exit(f"{name}: {out.stderr[-2000:]}")
            rows.append((name, r + 1, json.loads(out.stdout.strip().splitlines()[-1])))
    print(f"| build | round | create p50 ms | create p99 ms | 200 MiB write p50 ms | PSS per idle sandbox MiB |")
    print("|---|---|---|---|---|---|")
    for name, r, v in rows:
        print(f"| {name} | {r} | {v['create_p50']:.1f} | {v['create_p99']:.1f} | {v['write_200m_p50']:.0f} |"
              f" {v['pss_mb_mean']:.1f} |")


if __name__ == "__main__":
    main()
