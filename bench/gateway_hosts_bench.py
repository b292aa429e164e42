#!/usr/bin/env python3
"""`make bench`: a model call through the model gateway on the control role
(docs/gateway.md "On many hosts") against the same call through a host's
in-process gateway, in the same run. As in tests/store: a private
PostgreSQL (tests/pg/pg.py) holds the budgets, bindings and sessions; the
hosts run in network namespaces of their own on a bridge; the scripted
model is the upstream.

- baseline: host A runs the gateway itself (upstream options on A);
- via control: host B relays (`--gateway-control-url`) to the control
  role, which runs the gateway.

On each host a real session runs (its agent holds in a long `sleep`), so
its sandbox is bound to a live session: the gateway evaluates the
session's pinned policy and writes each call's intent and settle into the
session's log, as for an agent's own call. The bench calls each host's
`gateway.sock` as the host-service relay does (an `X-Hatchery-Sandbox`
header naming the session's sandbox): non-streaming chat completions, one
keep-alive connection each, BENCH_GW_N calls (default 300) alternated in
thirds. Prints p50/p99, the difference and the ratio. Loopback and
bench-made namespaces only; every daemon cancels its sessions and is
checked for leftovers."""

import http.client
import json
import os
import shutil
import socket
import sys
import tempfile
import time

HERE = os.path.dirname(__file__)
for p in ("../tests/integration", "../tests/pg", "../tests/sessions", "../tests/store"):
    sys.path.insert(0, os.path.join(HERE, p))

from gitserver import GitServer  # noqa: E402
from pg import Postgres  # noqa: E402
from scripted_model import ScriptedModel  # noqa: E402
from sessions_support import DEMO_FILES, SCRIPTS  # noqa: E402
from test_hosts import sql  # noqa: E402
from test_sessions_hosts import control_with_gateway, host  # noqa: E402
import hostnet  # noqa: E402

N = int(os.environ.get("BENCH_GW_N", "300"))
# The agent's one command holds the session running for the whole bench.
HOLD = [{"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 900"}}]}]
# The bench's own calls: the scripted model answers them with the first
# turn of the `quick` script.
BODY = json.dumps({"model": "scripted", "max_tokens": 16,
                   "messages": [{"role": "user", "content": "[script:quick] gateway bench"}]})


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


def calls(sock, n, sandbox):
    c = UnixHTTP(sock)
    out = []
    for _ in range(n):
        t = time.perf_counter()
        c.request("POST", "/v1/chat/completions", body=BODY,
                  headers={"content-type": "application/json", "x-hatchery-sandbox": sandbox})
        r = c.getresponse()
        body = r.read()
        assert r.status == 200, (r.status, body[:300])
        out.append((time.perf_counter() - t) * 1000)
    c.close()
    return out


def main():
    pg = Postgres(db="hxgwbench", fabric=True).start()
    git = GitServer(host=hostnet.GATEWAY).start()
    model = ScriptedModel({**SCRIPTS, "hold": HOLD}, host=hostnet.GATEWAY).start()
    files = tempfile.mkdtemp(prefix="hxgwb-")
    shared = os.path.join(files, "shared")
    os.mkdir(shared)
    prices = os.path.join(files, "prices.json")
    with open(prices, "w") as f:
        json.dump({"models": {"scripted": {"input_cents_per_mtok": 100, "output_cents_per_mtok": 400}}}, f)
    keyf = os.path.join(files, "key")
    with open(keyf, "w") as f:
        f.write("sk-bench")
    gw = (prices, keyf)
    daemons = []
    try:
        c = control_with_gateway(pg, "gb-ctl", model, gw)
        daemons.append(c)
        a = host(pg, "gb-a", model, shared, gateway=gw)
        daemons.append(a)
        b = host(pg, "gb-b", model, shared, gateway_control=f"http://{c.addr}:{c.port}")
        daemons.append(b)
        repo = git.add_repo("gwbench", DEMO_FILES)
        sandbox = {}
        for d in (a, b):
            sid = d.new_session(repo, "[script:hold] gateway bench")
            d.wait_event(sid, "tool_call", timeout=180)
            s = d.session(sid)
            assert s["state"] == "running" and s["sandbox_id"], s
            sandbox[d] = (sid, s["sandbox_id"])
        sa, sb = (os.path.join(d.data_dir, "gateway.sock") for d in (a, b))
        calls(sa, 20, sandbox[a][1])
        calls(sb, 20, sandbox[b][1])
        base, ctl = [], []
        for _ in range(3):
            base += calls(sa, N // 3, sandbox[a][1])
            ctl += calls(sb, N // 3, sandbox[b][1])
        b50, b99, c50, c99 = pct(base, 50), pct(base, 99), pct(ctl, 50), pct(ctl, 99)
        load = open("/proc/loadavg").read().split()[0]
        print(f"\nModel gateway on the control role, {time.strftime('%Y-%m-%d %H:%M')}, N={len(base)} each, "
              f"load {load} at the end\n")
        print("| path | p50 ms | p99 ms |\n|---|---|---|")
        print(f"| host's in-process gateway (baseline) | {b50:.2f} | {b99:.2f} |")
        print(f"| host relay -> control role's gateway | {c50:.2f} | {c99:.2f} |")
        print(f"| added by the control role | {c50 - b50:+.2f} ({c50 / b50:.2f}x) | {c99 - b99:+.2f} |")
        used = [sql(pg, f"SELECT used_tokens FROM gateway_budgets WHERE scope = 'session:{sid}'")
                for sid, _ in sandbox.values()]
        print(f"(each session's budget row, used_tokens: {used})")
    finally:
        # Cancels what still runs (the holding sessions), then the
        # harness's teardown and leak check.
        for d in reversed(daemons):
            d.cleanup_sessions()
        model.stop()
        git.stop()
        pg.stop()
        shutil.rmtree(files, ignore_errors=True)


if __name__ == "__main__":
    main()
