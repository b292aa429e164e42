"""`make bench`: what the control plane adds. One private PostgreSQL
(tests/pg/pg.py); in the same run, a single-host `--role all` daemon on it
(the baseline) and a `--role control` in front of a `--role host`.

- create: POST /v1/sandboxes -> 201, round robin: to the `all` daemon (the
  baseline), to the `host` daemon directly, and through control (placed on
  that same host: the `all` daemon has --max-sandboxes 1, so less room);
  each deleted again; pool off, so all restore the template checkpoint;
  every create names a tenant (`metadata.tenant`), so placement counts it;
- exec: POST /v1/sandboxes/{id}/exec `true`, on the host directly vs
  through control;
- get: GET /v1/sandboxes/{id} (the routing alone: a store lookup and one
  forwarded HTTP exchange).

Prints p50/p99 of each and the difference and ratio to the baseline
(`create*`: the same creates compared with the host daemon directly).
Env: BENCH_HOSTS_N (20 creates each), BENCH_HOSTS_M (100 execs/gets each).
Loopback only."""

import os
import sys
import time

HERE = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(HERE, "../tests/integration"))
sys.path.insert(0, os.path.join(HERE, "../tests/pg"))

from harness import Daemon  # noqa: E402
from pg import Postgres  # noqa: E402

N = int(os.environ.get("BENCH_HOSTS_N", "20"))
M = int(os.environ.get("BENCH_HOSTS_M", "100"))
ARGS = ["--max-ttl", "3600", "--pool-size", "0"]
# A tenant on every create (all three targets alike), so that the control
# plane's placement does its whole work: the per-tenant live count in SQL.
BODY = {"ttl_seconds": 300, "metadata": {"tenant": "bench"}}


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def timed(d, method, path, body=None, want=200):
    t = time.perf_counter()
    r = d.request(method, path, body)
    dt = (time.perf_counter() - t) * 1000
    assert r.status == want, r
    return dt, r


def report(name, base, ctl):
    b50, b99, c50, c99 = pct(base, 50), pct(base, 99), pct(ctl, 50), pct(ctl, 99)
    print(f"{name:8s} baseline p50 {b50:8.2f} ms p99 {b99:8.2f} ms | via control p50 {c50:8.2f} ms "
          f"p99 {c99:8.2f} ms | added p50 {c50 - b50:+.2f} ms, ratio {c50 / b50:.2f}x")


def main():
    pg = Postgres(db="hxhostsbench").start()
    ds = []
    try:
        base = Daemon(extra_args=[*ARGS, "--db", pg.dsn, "--host-id", "bench-all", "--max-sandboxes", "1"]).start()
        ds.append(base)
        host = Daemon(extra_args=[*ARGS, "--db", pg.dsn, "--host-id", "bench-host", "--role", "host"]).start()
        ds.append(host)
        ctl = Daemon(extra_args=[*ARGS, "--db", pg.dsn, "--host-id", "bench-ctl", "--role", "control"]).start()
        ds.append(ctl)
        cb, ch, cc, placed = [], [], [], {}
        for _ in range(N):
            dt, r = timed(base, "POST", "/v1/sandboxes", BODY, 201)
            cb.append(dt)
            base.delete(r.json()["id"])
            dt, r = timed(host, "POST", "/v1/sandboxes", BODY, 201)
            ch.append(dt)
            host.delete(r.json()["id"])
            dt, r = timed(ctl, "POST", "/v1/sandboxes", BODY, 201)
            cc.append(dt)
            sid = r.json()["id"]
            # Answered locally (no forwarding) only by the owner.
            here = host.request("GET", f"/v1/sandboxes/{sid}", headers={"X-Hatchery-Forwarded-By": "bench"})
            owner = "bench-host" if here.status == 200 else "bench-all"
            placed[owner] = placed.get(owner, 0) + 1
            ctl.delete(sid)
        sid = host.create(ttl_seconds=600)
        eb, ec, gb, gc = [], [], [], []
        for _ in range(M):
            eb.append(timed(host, "POST", f"/v1/sandboxes/{sid}/exec", {"cmd": "true"})[0])
            ec.append(timed(ctl, "POST", f"/v1/sandboxes/{sid}/exec", {"cmd": "true"})[0])
            gb.append(timed(host, "GET", f"/v1/sandboxes/{sid}")[0])
            gc.append(timed(ctl, "GET", f"/v1/sandboxes/{sid}")[0])
        print(f"hosts bench: N={N} creates each, M={M} execs/gets each; control placed its creates on {placed}")
        report("create", cb, cc)
        report("create*", ch, cc)
        report("exec", eb, ec)
        report("get", gb, gc)
    finally:
        for d in reversed(ds):
            d.cleanup()
        pg.stop()


if __name__ == "__main__":
    main()
