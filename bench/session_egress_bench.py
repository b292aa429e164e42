"""`make bench`: the egress proxy on the path a session's tools really take,
measured from inside a session sandbox. Baseline, in the same run: the same
loopback servers reached through a plain host service (guest 127.0.0.1 →
agent relay → host), so the difference is what the proxy adds (CONNECT,
pinned-policy evaluation, resolve, dial, the session event) on top of the
relay both paths share.

- connect: a fresh connection plus a 1-byte echo, N times, alternating
  direct host service / CONNECT through 127.0.0.1:3128;
- throughput: MiB streamed from a source server, through each path.

The measuring code runs as the session's agent (`agent.kind: command`) and
prints one JSON line, which the log keeps as `agent_output`.
Env: BENCH_EGRESS_N (200), BENCH_EGRESS_MIB (128). Loopback only."""

import json
import os
import socket
import sys
import threading
import time

HERE = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(HERE, "../tests/integration"))
sys.path.insert(0, os.path.join(HERE, "../tests/sessions"))

from gitserver import GitServer  # noqa: E402
from harness import Daemon  # noqa: E402

N = int(os.environ.get("BENCH_EGRESS_N", "200"))
MIB = int(os.environ.get("BENCH_EGRESS_MIB", "128"))
HOST = "127.0.0.2"

IN_SANDBOX = r'''
import json, socket, sys, time
n, mib, echo, src = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])

def via_proxy(port):
    s = socket.create_connection(("127.0.0.1", 3128))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(b"CONNECT 127.0.0.2:%d HTTP/1.1\r\nHost: 127.0.0.2:%d\r\n\r\n" % (port, port))
    head = b""
    while b"\r\n\r\n" not in head:
        c = s.recv(1)
        if not c:
            raise SystemExit("proxy closed: %r" % head)
        head += c
    if not head.startswith(b"HTTP/1.1 200"):
        raise SystemExit("proxy refused: %r" % head)
    return s

def pipelined(port):
    """CONNECT and the first byte in one write (the proxy forwards what
    follows the head): no wait for the 200 before sending."""
    t = time.perf_counter()
    s = socket.create_connection(("127.0.0.1", 3128))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(b"CONNECT 127.0.0.2:%d HTTP/1.1\r\nHost: 127.0.0.2:%d\r\n\r\nx" % (port, port))
    buf = b""
    while not (b"\r\n\r\n" in buf and buf.endswith(b"x")):
        c = s.recv(4096)
        if not c:
            raise SystemExit("proxy closed: %r" % buf)
        buf += c
    dt = time.perf_counter() - t
    s.close()
    return dt * 1000

def direct(port):
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s

def once(open_):
    t = time.perf_counter()
    s = open_()
    s.sendall(b"x")
    assert s.recv(1) == b"x"
    dt = time.perf_counter() - t
    s.close()
    return dt * 1000

d, p, pp = [], [], []
for i in range(n + 10):
    a = once(lambda: direct(9210))
    b = once(lambda: via_proxy(echo))
    c = pipelined(echo)
    if i >= 10:
        d.append(a); p.append(b); pp.append(c)

def pull(s):
    want, got, t = mib << 20, 0, time.perf_counter()
    s.sendall(b"go")
    while got < want:
        c = s.recv(1 << 16)
        if not c:
            break
        got += len(c)
    return got / (1 << 20) / (time.perf_counter() - t)

td = pull(direct(9211))
tp = pull(via_proxy(src))
def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(q / 100 * (len(v) - 1))))]

# Summaries only: event text over 4 KiB is cut (the whole goes to a blob).
print(json.dumps({"bench": {"n": len(d), "direct_p50": pct(d, 50), "direct_p99": pct(d, 99),
                            "proxy_p50": pct(p, 50), "proxy_p99": pct(p, 99),
                            "pipelined_p50": pct(pp, 50), "pipelined_p99": pct(pp, 99),
                            "direct_mibps": td, "proxy_mibps": tp}}), flush=True)
'''


def skip_proxy_line(c):
    """Host services with identity=proxy send `PROXY UNKNOWN <id>\\r\\n`
    first; the CONNECT path sends nothing before the guest's bytes."""
    first = c.recv(1)
    if first == b"P":
        buf = first
        while not buf.endswith(b"\r\n"):
            buf += c.recv(1)
        return b""
    return first


def echo_server():
    ls = socket.create_server((HOST, 0))

    def serve(c):
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            pending = skip_proxy_line(c)
            if pending:
                c.sendall(pending)
            while True:
                b = c.recv(4096)
                if not b:
                    break
                c.sendall(b)
        except OSError:
            pass
        c.close()

    threading.Thread(target=lambda: [threading.Thread(target=serve, args=(ls.accept()[0],), daemon=True).start()
                                     for _ in iter(int, 1)], daemon=True).start()
    return ls.getsockname()[1]


def source_server():
    ls = socket.create_server((HOST, 0))
    chunk = b"\0" * (1 << 16)

    def serve(c):
        try:
            got = skip_proxy_line(c)
            while len(got) < 2:
                got += c.recv(2 - len(got))
            for _ in range((MIB << 20) // len(chunk)):
                c.sendall(chunk)
        except OSError:
            pass
        c.close()

    threading.Thread(target=lambda: [threading.Thread(target=serve, args=(ls.accept()[0],), daemon=True).start()
                                     for _ in iter(int, 1)], daemon=True).start()
    return ls.getsockname()[1]


def main():
    echo, src = echo_server(), source_server()
    git = GitServer().start()
    d = Daemon(extra_args=["--pool-size", "1", "--max-ttl", "7200",
                           "--host-service", f"echo=9210={HOST}:{echo},identity=proxy",
                           "--host-service", f"src=9211={HOST}:{src},identity=proxy"]).start()
    try:
        r = d.request("POST", "/v1/policies", {"name": "bench", "rules": [
            {"id": "bench", "effect": "allow", "match": {"tools": ["egress"], "hosts": [f"{HOST}/32"],
                                                          "ports": [echo, src]}}]})
        assert r.status == 201, r
        repo = git.add_repo("bench", {"bench.py": IN_SANDBOX})
        r = d.request("POST", "/v1/sessions", {
            "repo": repo, "task": "bench", "policy_id": r.json()["id"],
            "agent": {"kind": "command", "command": f"python3 bench.py {N} {MIB} {echo} {src}"}})
        assert r.status == 201, r
        sid = r.json()["session_id"]
        deadline = time.time() + 600
        while time.time() < deadline:
            s = d.request("GET", f"/v1/sessions/{sid}").json()
            if s["state"] in ("completed", "failed", "cancelled"):
                break
            time.sleep(0.5)
        evs = d.request("GET", f"/v1/sessions/{sid}/events?limit=1000").json()["events"]
        for e in evs:
            if e["type"] == "sandbox_ready":
                d.created.add(e["sandbox_id"])
        assert s["state"] == "completed", (s, [e for e in evs if e["type"] in ("error", "agent_output")][-3:])
        out = next(json.loads(e["text"])["bench"] for e in evs
                   if e["type"] == "agent_output" and e["text"].startswith('{"bench"'))
        allowed = sum(1 for e in evs if e["type"] == "egress" and e["verdict"] == "allowed")
        print(f"\nEgress proxy from inside a session sandbox, {time.strftime('%Y-%m-%d %H:%M')}, N={out['n']}, "
              f"{MIB} MiB, load {os.getloadavg()[0]:.1f}\n")
        print("| path | connect + 1-byte echo p50 ms | p99 ms |")
        print("|---|---|---|")
        print(f"| host service relay (baseline) | {out['direct_p50']:.2f} | {out['direct_p99']:.2f} |")
        print(f"| relay + egress proxy (CONNECT) | {out['proxy_p50']:.2f} | {out['proxy_p99']:.2f} |")
        print(f"| relay + egress proxy, CONNECT and first byte in one write | {out['pipelined_p50']:.2f} | "
              f"{out['pipelined_p99']:.2f} |")
        print(f"| proxy overhead, waiting for the 200 (goal <= 1 ms at p50) | "
              f"{out['proxy_p50'] - out['direct_p50']:.2f} | |")
        print(f"| proxy overhead, pipelined | {out['pipelined_p50'] - out['direct_p50']:.2f} | |")
        print(f"\nthroughput: relay {out['direct_mibps']:.0f} MiB/s, relay + proxy {out['proxy_mibps']:.0f} MiB/s "
              f"({out['proxy_mibps'] / out['direct_mibps'] * 100:.0f} %); {allowed} allowed egress events logged")
    finally:
        r = d.request("GET", "/v1/snapshots")
        if r.status == 200:
            for sn in r.json()["snapshots"]:
                d.request("DELETE", f"/v1/snapshots/{sn['id']}")
        d.cleanup()
        git.stop()


if __name__ == "__main__":
    main()
