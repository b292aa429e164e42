#!/usr/bin/env python3
"""`make bench`: the model gateway's overhead over calling the upstream
directly (non-streaming chat completions, one keep-alive connection each,
N=300), against the scripted upstream of tests/gateway. Loopback only."""

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


def main():
    up = Upstream()
    g = Gateway(up)
    try:
        key = g.key("ses_bench")
        calls(up.port, {}, 20)
        calls(g.port, {"authorization": f"Bearer {key}"}, 20)
        direct, through = [], []
        for _ in range(3):  # alternated
            direct += calls(up.port, {}, N // 3)
            through += calls(g.port, {"authorization": f"Bearer {key}"}, N // 3)
        print(f"\nModel gateway, {time.strftime('%Y-%m-%d %H:%M')}, N={N}\n")
        print("| path | p50 ms | p99 ms |\n|---|---|---|")
        print(f"| upstream directly | {pct(direct, 50):.2f} | {pct(direct, 99):.2f} |")
        print(f"| through the gateway (reserve, forward, settle) | {pct(through, 50):.2f} | {pct(through, 99):.2f} |")
        print(f"| overhead | {pct(through, 50) - pct(direct, 50):.2f} | |")
    finally:
        g.stop()
        up.close()


if __name__ == "__main__":
    main()
