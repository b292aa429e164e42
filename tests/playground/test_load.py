"""Bounded load on loopback: 200 runs from 50 simulated client IPs over about
60 s (X-Forwarded-For from the trusted proxy 127.0.0.1), mixing cached and
uncached snippets, with a low in-flight cap so that 503s appear, and two
noisy clients so that 429s appear. Afterwards: no sandbox left, daemon
memory back near its baseline. Writes target/test-artifacts/playground-load.json."""

import json
import os
import random
import threading
import time
import uuid

from pg_harness import REPO, Gateway, assert_no_sandboxes, read_sse, sandboxes, start_daemon, wait_for

ARTIFACTS = os.environ.get("HATCHERY_TEST_ARTIFACTS", os.path.join(REPO, "target/test-artifacts"))
DURATION = float(os.environ.get("PLAYGROUND_LOAD_SECONDS", "60"))
IN_FLIGHT = 3
COMMON = [f"# common {i}\nprint(sum(range({1000 * (i + 1)})))\n" for i in range(8)]


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round((len(xs) - 1) * p)))]


def schedule(rng):
    """(at_seconds, ip, code): 45 quiet IPs x 4 runs (their last run all at
    the same moment, a spike past the in-flight cap), 2 noisy IPs x 10 runs
    in one burst (past the rate limit). 200 in all."""
    plan = []
    for n in range(45):
        addr = f"192.0.2.{n + 1}"
        for k in range(3):
            plan.append((rng.uniform(0, DURATION), addr, k))
        plan.append((DURATION / 2, addr, 3))
    for n in range(2):
        addr = f"198.18.0.{n + 1}"
        start = rng.uniform(0, DURATION - 5)
        plan.extend((start + i * 0.05, addr, i) for i in range(10))
    out = []
    for at, addr, k in plan:
        code = rng.choice(COMMON) if rng.random() < 0.5 else f"print('unique', '{uuid.uuid4().hex}')\n"
        out.append((at, addr, code))
    return sorted(out)


def test_load_caps_hold_nothing_leaks():
    daemon = start_daemon(pool=2)
    gw = None
    try:
        wait_for(lambda: daemon.request("GET", "/healthz", auth=False).status == 200, what="daemon")
        gw = Gateway(daemon, ["--trusted-proxy", "127.0.0.1", "--max-in-flight", str(IN_FLIGHT)]).start()
        # Warm up (pool filled, checkpoint baked), then take the baseline.
        for i in range(3):
            r = gw.run(f"print('warm {i}')", ip=f"203.0.113.{i + 1}")
            assert r.status == 200 and r.exit()["exit_code"] == 0, r
        time.sleep(3)
        base_rss = daemon.rss_kb()
        base_gw_rss = gw.rss_kb()

        results, lock = [], threading.Lock()
        peak = {"sandboxes": 0, "in_flight": 0}
        stop = threading.Event()

        def monitor():
            while not stop.is_set():
                n = len(sandboxes(daemon))
                f = gw.metric("hatchery_playground_in_flight")
                peak["sandboxes"] = max(peak["sandboxes"], n)
                peak["in_flight"] = max(peak["in_flight"], f)
                time.sleep(0.1)

        def one(at, addr, code, t_start):
            time.sleep(max(0.0, t_start + at - time.monotonic()))
            t0 = time.monotonic()
            conn, r = gw.open_run(code, ip=addr, timeout=60)
            row = {"status": r.status, "ip": addr}
            if r.status == 200:
                first = []
                events, times = read_sse(r, lambda ev: first.append(time.monotonic()) if not first else None)
                row["events"] = [e for e, _ in events]
                ex = [d for e, d in events if e == "exit"]
                row["cached"] = bool(ex and ex[0]["cached"])
                row["latency"] = (times[-1] - t0) if times else None
                row["ok"] = len(ex) == 1 and ex[0]["exit_code"] == 0
            else:
                r.read()
            conn.close()
            with lock:
                results.append(row)

        plan = schedule(random.Random(7))
        assert len(plan) == 200
        mon = threading.Thread(target=monitor, daemon=True)
        mon.start()
        t_start = time.monotonic() + 0.5
        threads = [threading.Thread(target=one, args=(at, addr, code, t_start)) for at, addr, code in plan]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        wall = time.monotonic() - t_start
        stop.set()
        mon.join()

        statuses = {}
        for r in results:
            statuses[r["status"]] = statuses.get(r["status"], 0) + 1
        ran = [r for r in results if r["status"] == 200 and not r["cached"]]
        cached = [r for r in results if r["status"] == 200 and r["cached"]]
        report = {
            "requests": len(results), "wall_s": round(wall, 1),
            "ran": len(ran), "cached": len(cached),
            "429": statuses.get(429, 0), "503": statuses.get(503, 0),
            "other_status": {k: v for k, v in statuses.items() if k not in (200, 429, 503)},
            "ran_latency_ms": {"p50": round(pct([r["latency"] for r in ran], 0.5) * 1000),
                               "p99": round(pct([r["latency"] for r in ran], 0.99) * 1000)},
            "cached_latency_ms": {"p50": round(pct([r["latency"] for r in cached], 0.5) * 1000, 1),
                                  "p99": round(pct([r["latency"] for r in cached], 0.99) * 1000, 1)},
            "in_flight_cap": IN_FLIGHT, "peak_in_flight": peak["in_flight"], "peak_sandboxes": peak["sandboxes"],
        }
        print("\nplayground load:", json.dumps(report))

        assert len(results) == 200
        assert report["other_status"] == {}, report
        assert all(r["ok"] for r in results if r["status"] == 200), [r for r in results if r.get("ok") is False]
        assert report["ran"] > 30 and report["cached"] > 10, report
        assert report["429"] >= 8, report  # each noisy IP: 10 in a burst of 6
        assert report["503"] > 0, report
        assert peak["in_flight"] <= IN_FLIGHT, report
        # A deleted sandbox may linger in the list for an instant; the cap
        # on live ones holds.
        assert peak["sandboxes"] <= IN_FLIGHT, report

        assert_no_sandboxes(daemon)
        stats = gw.get("/playground/stats").json()
        wait_for(lambda: gw.get("/playground/stats").json()["requests"] >= 203, timeout=10, what="rows")
        stats = gw.get("/playground/stats").json()
        assert stats["ran"] == report["ran"] + 3 and stats["cached"] == report["cached"], (stats, report)
        assert stats["refused"].get("rate_limited", 0) == report["429"]
        assert stats["refused"].get("busy", 0) == report["503"]

        # Memory back near the baseline once the pool has refilled.
        def settled():
            return daemon.rss_kb() <= base_rss + 32 * 1024
        try:
            wait_for(settled, timeout=30, what="daemon RSS back near baseline")
        finally:
            report["daemon_rss_mib"] = {"baseline": round(base_rss / 1024, 1), "after": round(daemon.rss_kb() / 1024, 1)}
            report["gateway_rss_mib"] = {"baseline": round(base_gw_rss / 1024, 1), "after": round(gw.rss_kb() / 1024, 1)}
            os.makedirs(ARTIFACTS, exist_ok=True)
            with open(os.path.join(ARTIFACTS, "playground-load.json"), "w") as f:
                json.dump(report, f, indent=2)
            print("playground load memory:", report["daemon_rss_mib"], report["gateway_rss_mib"])
        assert gw.rss_kb() <= base_gw_rss + 32 * 1024, report
    finally:
        if gw:
            gw.cleanup()
        try:
            assert_no_sandboxes(daemon)
        finally:
            daemon.cleanup()
