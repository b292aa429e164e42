#!/usr/bin/env python3
"""`make bench`, playground part: "Run pressed -> first output byte" through
hatchery-playground, for an uncached hello world (fresh sandbox from the warm
pool, then the snippet run) and for a cache hit, measured from sending the
POST to the arrival of the first stdout event; and 8 visitors pressing Run
at once (uncached), measured from the POST to the `exit` event. All traffic
is to 127.0.0.1."""

import concurrent.futures
import json
import os
import sys
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../tests/playground"))
from pg_harness import Gateway, assert_no_sandboxes, metric, start_daemon, wait_for  # noqa: E402

N = int(os.environ.get("BENCH_N", "20"))


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(p / 100 * (len(xs) - 1)))))]


def first_byte(gw, code, ip="127.0.0.1"):
    """(ms to the first stdout event, cached, ms to the exit event)."""
    t0 = time.perf_counter()
    conn, r = gw.open_run(code, ip=ip)
    assert r.status == 200, r.status
    first, cached, end = None, None, None
    event = None
    while True:
        line = r.readline()
        if not line:
            break
        line = line.decode().strip()
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:") and event:
            d = json.loads(line[5:])
            if event == "stdout" and first is None:
                first = (time.perf_counter() - t0) * 1000
            if event == "exit":
                cached = d["cached"]
                end = (time.perf_counter() - t0) * 1000
                assert d["exit_code"] == 0, d
    conn.close()
    assert first is not None and end is not None
    return first, cached, end


def row(name, xs):
    return f"| {name:<44} | {len(xs):>4} | {pct(xs, 50):>8.1f} | {pct(xs, 99):>8.1f} |"


def main():
    d = start_daemon(pool=8)
    gw = None
    try:
        wait_for(lambda: metric(d, "hatchery_pool_ready") >= 8, timeout=120, what="warm pool")
        gw = Gateway(d, ["--ip-burst", "1000", "--ip-per-minute", "100000",
                         "--session-burst", "1000", "--session-per-minute", "100000"]).start()
        uncached, hits = [], []
        for i in range(N + 1):
            wait_for(lambda: metric(d, "hatchery_pool_ready") >= 1, timeout=60, what="pool sandbox")
            ms, cached, _ = first_byte(gw, f"print('hello, world')  # {uuid.uuid4().hex}\n")
            assert cached is False
            if i:  # first one warms the gateway's template version lookup
                uncached.append(ms)
            time.sleep(0.3)
        hot = "print('hello, world')\n"
        first_byte(gw, hot)
        for _ in range(N):
            ms, cached, _ = first_byte(gw, hot)
            assert cached is True
            hits.append(ms)
        # 8 at once, uncached, three rounds; each round starts with a full pool.
        conc, conc_first = [], []
        for rnd in range(3):
            wait_for(lambda: metric(d, "hatchery_pool_ready") >= 8, timeout=120, what="full pool")
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                got = list(pool.map(
                    lambda i: first_byte(gw, f"print(sum(range(10**5)))  # {uuid.uuid4().hex}\n",
                                         ip=f"127.0.0.{i + 2}"), range(8)))
            assert all(c is False for _, c, _ in got)
            conc += [end for _, _, end in got]
            conc_first += [f for f, _, _ in got]
        assert_no_sandboxes(d)
        print(f"\nPlayground: Run pressed -> first output byte, through the gateway (N={N})\n")
        print(f"| {'operation':<44} | {'n':>4} | {'p50 ms':>8} | {'p99 ms':>8} |")
        print(f"|{'-' * 46}|{'-' * 6}|{'-' * 10}|{'-' * 10}|")
        print(row("playground: hello world, uncached (pool)", uncached))
        print(row("playground: hello world, cache hit", hits))
        print(row("playground: 8 concurrent, uncached, to exit", conc))
        print(row("playground: 8 concurrent, uncached, 1st byte", conc_first))
        out = os.environ.get("BENCH_JSON")
        if out:
            data = json.load(open(out)) if os.path.exists(out) else {}
            data["playground_first_byte_ms"] = {
                "uncached": {"p50": pct(uncached, 50), "p99": pct(uncached, 99), "n": len(uncached)},
                "cache_hit": {"p50": pct(hits, 50), "p99": pct(hits, 99), "n": len(hits)},
            }
            data["playground_8_concurrent_ms"] = {
                "to_exit": {"p50": pct(conc, 50), "p99": pct(conc, 99), "n": len(conc)},
                "first_byte": {"p50": pct(conc_first, 50), "p99": pct(conc_first, 99), "n": len(conc_first)},
            }
            json.dump(data, open(out, "w"), indent=2)
    finally:
        if gw:
            gw.cleanup()
        d.cleanup()


if __name__ == "__main__":
    main()
