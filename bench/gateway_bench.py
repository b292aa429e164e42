#!/usr/bin/env python3
"""`make bench`: the model gateway's overhead over calling the upstream
directly (non-streaming chat completions, one keep-alive connection each,
N=300), against the scripted upstream of tests/gateway, with a session's
key and with a tenant's session's key (two budget scopes). On SQLite, and
on PostgreSQL too when HATCHERY_TEST_PG_DSN names one (make bench runs it
under tests/pg/pg.py). Loopback only."""

import http.client
import json
import os
import socket
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../tests/gateway"))
from scripted_upstream import Upstream  # noqa: E402
from test_gateway import Gateway  # noqa: E402

N = 300


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round((len(xs) - 1) * p / 100)))]


def calls(port, headers, n):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.connect()
    # http.client writes the head and the body separately: without this,
    # Nagle plus delayed ACKs add 40 ms to every direct call.
    c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    body = json.dumps({"model": "gpt-test", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]})
    out = []
    for _ in range(n):
        t = time.perf_counter()
        c.request("POST", "/v1/chat/completions", body=body, headers=dict(headers, **{"content-type": "application/json"}))
        r = c.getresponse()
        r.read()
        assert r.status == 200, r.status
        out.append((time.perf_counter() - t) * 1000)
    c.close()
    return out


def measure(db, label):
    """Direct and through the gateway alternated in one run, with a
    session's key (one budget scope) and a tenant's session's key (two:
    session + tenant, both reserved and settled per call)."""
    up = Upstream()
    g = Gateway(up, db=db)
    try:
        keys = {"session": g.key("ses_bench"), "session + tenant": g.key("ses_bench_t", tenant="ten_bench")}
        g.budget("tenant:ten_bench", tokens=10 ** 12)
        calls(up.port, {}, 20)
        for k in keys.values():
            calls(g.port, {"authorization": f"Bearer {k}"}, 20)
        direct, through = [], {k: [] for k in keys}
        for _ in range(3):  # alternated
            direct += calls(up.port, {}, N // 3)
            for name, k in keys.items():
                through[name] += calls(g.port, {"authorization": f"Bearer {k}"}, N // 3)
        print(f"\nModel gateway ({label}), {time.strftime('%Y-%m-%d %H:%M')}, N={N} each, "
              f"load {os.getloadavg()[0]:.1f}\n")
        print("| path | p50 ms | p99 ms | overhead at p50 ms |\n|---|---|---|---|")
        print(f"| upstream directly | {pct(direct, 50):.2f} | {pct(direct, 99):.2f} | |")
        for name, xs in through.items():
            print(f"| through the gateway, {name} scope(s) (reserve, forward, settle) | {pct(xs, 50):.2f} | "
                  f"{pct(xs, 99):.2f} | {pct(xs, 50) - pct(direct, 50):.2f} |")
    finally:
        g.stop()
        up.close()


def main():
    measure(None, "SQLite")
    dsn = os.environ.get("HATCHERY_TEST_PG_DSN")
    if dsn:
        measure(dsn, "PostgreSQL, loopback")
    else:
        print("\n(PostgreSQL: not run; set HATCHERY_TEST_PG_DSN, or run under tests/pg/pg.py)")


if __name__ == "__main__":
    main()
