#!/usr/bin/env python3
"""`make bench`, playground part: "Run pressed -> first output byte" through
hatchery-playground, for an uncached hello world (fresh sandbox from the warm
pool, file write, python3) and for a cache hit. Measured from sending the
POST to the arrival of the first stdout event. All traffic is to 127.0.0.1."""

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


def first_byte(gw, code):
    t0 = time.perf_counter()
    conn, r = gw.open_run(code, ip="127.0.0.1")
    assert r.status == 200, r.status
    first, cached = None, None
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
    conn.close()
    assert first is not None
    return first, cached


def row(name, xs):
    return f"| {name:<44} | {len(xs):>4} | {pct(xs, 50):>8.1f} | {pct(xs, 99):>8.1f} |"


def main():
    d = start_daemon(pool=2)
    gw = None
    try:
        wait_for(lambda: metric(d, "hatchery_pool_ready") >= 2, timeout=120, what="warm pool")
        gw = Gateway(d, ["--ip-burst", "1000", "--ip-per-minute", "100000",
                         "--session-burst", "1000", "--session-per-minute", "100000"]).start()
        uncached, hits = [], []
        for i in range(N + 1):
            wait_for(lambda: metric(d, "hatchery_pool_ready") >= 1, timeout=60, what="pool sandbox")
            ms, cached = first_byte(gw, f"print('hello, world')  # {uuid.uuid4().hex}\n")
            assert cached is False
            if i:  # first one warms the gateway's template version lookup
                uncached.append(ms)
            time.sleep(0.3)
        hot = "print('hello, world')\n"
        first_byte(gw, hot)
        for _ in range(N):
            ms, cached = first_byte(gw, hot)
            assert cached is True
            hits.append(ms)
        assert_no_sandboxes(d)
        print(f"\nPlayground: Run pressed -> first output byte, through the gateway (N={N})\n")
        print(f"| {'operation':<44} | {'n':>4} | {'p50 ms':>8} | {'p99 ms':>8} |")
        print(f"|{'-' * 46}|{'-' * 6}|{'-' * 10}|{'-' * 10}|")
        print(row("playground: hello world, uncached (pool)", uncached))
        print(row("playground: hello world, cache hit", hits))
        out = os.environ.get("BENCH_JSON")
        if out:
            data = json.load(open(out)) if os.path.exists(out) else {}
            data["playground_first_byte_ms"] = {
                "uncached": {"p50": pct(uncached, 50), "p99": pct(uncached, 99), "n": len(uncached)},
                "cache_hit": {"p50": pct(hits, 50), "p99": pct(hits, 99), "n": len(hits)},
            }
            json.dump(data, open(out, "w"), indent=2)
    finally:
        if gw:
            gw.cleanup()
        d.cleanup()


if __name__ == "__main__":
    main()
