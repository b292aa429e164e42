#!/usr/bin/env python3
"""`make bench`: a model call through the model gateway on the control role
(docs/gateway.md "On many hosts") against the same call through a host's
in-process gateway, in the same run. One private PostgreSQL
(tests/pg/pg.py) holds the budgets and bindings; the scripted upstream of
tests/gateway answers on loopback.

- baseline: host A runs the gateway itself (upstream options on A);
- via control: host B relays (`--gateway-control-url`) to the control
  role, which runs the gateway.

Both are called on their `gateway.sock` as the host-service relay calls
them (an `X-Hatchery-Sandbox` header naming a sandbox bound in the shared
`sandbox_bindings`), non-streaming chat completions, one keep-alive
connection each, BENCH_GW_N calls (default 300) alternated in thirds.
Prints p50/p99, the difference and the ratio. Loopback only; every daemon
is stopped and checked for leftovers."""

import http.client
import json
import os
import shutil
import socket
import sys
import tempfile
import time

HERE = os.path.dirname(__file__)
for p in ("../tests/integration", "../tests/pg", "../tests/gateway", "../tests/store"):
    sys.path.insert(0, os.path.join(HERE, p))

from harness import Daemon  # noqa: E402
from pg import Postgres  # noqa: E402
from scripted_upstream import Upstream  # noqa: E402
from test_hosts import sql  # noqa: E402

N = int(os.environ.get("BENCH_GW_N", "300"))
SANDBOX = "sbx_gwbench00000000"
BODY = json.dumps({"model": "gpt-test", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]})


class UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=30)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round((len(xs) - 1) * p / 100)))]


def calls(sock, n):
    c = UnixHTTP(sock)
    out = []
    for _ in range(n):
        t = time.perf_counter()
        c.request("POST", "/v1/chat/completions", body=BODY,
                  headers={"content-type": "application/json", "x-hatchery-sandbox": SANDBOX})
        r = c.getresponse()
        body = r.read()
        assert r.status == 200, (r.status, body[:300])
        out.append((time.perf_counter() - t) * 1000)
    c.close()
    return out


def main():
    pg = Postgres(db="hxgwbench").start()
    up = Upstream()
    files = tempfile.mkdtemp(prefix="hxgwb-")
    prices = os.path.join(files, "prices.json")
    with open(prices, "w") as f:
        json.dump({"models": {"gpt-test": {"input_cents_per_mtok": 100, "output_cents_per_mtok": 400}}}, f)
    keyf = os.path.join(files, "key")
    with open(keyf, "w") as f:
        f.write("sk-bench")
    gw = ["--gateway-openai-upstream", f"http://127.0.0.1:{up.port}", "--gateway-prices", prices,
          "--gateway-upstream-key-file", keyf]
    common = ["--db", pg.dsn, "--pool-size", "0"]
    daemons = []
    try:
        c = Daemon(extra_args=[*common, "--host-id", "gb-ctl", "--role", "control", *gw]).start()
        daemons.append(c)
        a = Daemon(extra_args=[*common, "--host-id", "gb-a", "--role", "host", *gw]).start()
        daemons.append(a)
        b = Daemon(extra_args=[*common, "--host-id", "gb-b", "--role", "host",
                               "--gateway-control-url", f"http://127.0.0.1:{c.port}"]).start()
        daemons.append(b)
        sql(pg, "INSERT INTO gateway_sandbox_bindings (sandbox, session, tenant) "
                f"VALUES ('{SANDBOX}', 'ses_gwbench', NULL) ON CONFLICT DO NOTHING")
        sa, sb = (os.path.join(d.data_dir, "gateway.sock") for d in (a, b))
        calls(sa, 20)
        calls(sb, 20)
        base, ctl = [], []
        for _ in range(3):
            base += calls(sa, N // 3)
            ctl += calls(sb, N // 3)
        b50, b99, c50, c99 = pct(base, 50), pct(base, 99), pct(ctl, 50), pct(ctl, 99)
        print(f"\nModel gateway on the control role, {time.strftime('%Y-%m-%d %H:%M')}, N={len(base)} each\n")
        print("| path | p50 ms | p99 ms |\n|---|---|---|")
        print(f"| host's in-process gateway (baseline) | {b50:.2f} | {b99:.2f} |")
        print(f"| host relay -> control role's gateway | {c50:.2f} | {c99:.2f} |")
        print(f"| added by the control role | {c50 - b50:+.2f} ({c50 / b50:.2f}x) | {c99 - b99:+.2f} |")
        used = sql(pg, "SELECT used_tokens FROM gateway_budgets WHERE scope = 'session:ses_gwbench'")
        print(f"(one budget row for both paths: used_tokens {used})")
    finally:
        for d in reversed(daemons):
            d.cleanup()
        up.close()
        pg.stop()
        shutil.rmtree(files, ignore_errors=True)


if __name__ == "__main__":
    main()
