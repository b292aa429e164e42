"""hatcheryd on PostgreSQL (`--db postgres://...`): the API end to end with
its state in a private PostgreSQL (tests/pg/pg.py), a restart re-adopting
from it, two hosts sharing it without touching each other's sandboxes, and
a host whose lease was taken over killing its own sandboxes and refusing
work (503) while the new holder's writes win. Every daemon is checked for
leftovers at the end (harness.Daemon.cleanup)."""

import os
import subprocess
import sys
import threading
import time

import pytest

HERE = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, os.path.join(HERE, "..", "pg"))

from harness import Daemon, arg, wait_for  # noqa: E402
from pg import Postgres, pg_bin  # noqa: E402

ARGS = ["--max-ttl", "3600", "--pool-size", "0"]


@pytest.fixture(scope="module")
def pg():
    p = Postgres(db="hxstore").start()
    yield p
    p.stop()


def sql(pg, q):
    r = subprocess.run(["runuser", "-u", "postgres", "--", pg_bin("psql"), "-h", pg.dir, "-p", str(pg.port),
                        "-d", pg.db, "-AtF", "|", "-c", q], capture_output=True, text=True, check=True)
    return [line.split("|") for line in r.stdout.splitlines() if line]


def daemon(pg, host, restart_of=None):
    """A daemon for `host`; `restart_of` restarts that (crashed) daemon: the
    same data dir and the same network prefix and range, as a real restart
    has, so its network slots are reclaimed rather than left behind."""
    args = [*ARGS, "--db", pg.dsn, "--host-id", host]
    if restart_of is not None:
        for flag in ("--net-prefix", "--net-range"):
            args += [flag, arg(restart_of.extra_args, flag)]
    return Daemon(extra_args=args, data_dir=restart_of.data_dir if restart_of else None).start()


def test_api_end_to_end_on_postgres(pg):
    d = daemon(pg, "pg-a")
    try:
        full = open(d.log_path, errors="replace").read()
        assert "state store open" in full and "postgres" in full
        # Registered, with where its API listens and what it takes.
        assert sql(pg, "SELECT address, capacity FROM core_hosts WHERE id = 'pg-a'") == [[f"127.0.0.1:{d.port}", "64"]]
        sid = d.create(ttl_seconds=300, metadata={"suite": "store", "n": "1"})
        other = d.create(ttl_seconds=300, metadata={"suite": "store", "n": "2"})
        assert d.exec(sid, "echo hi")["stdout"] == "hi\n"
        # The metadata filter is answered by PostgreSQL (JSONB containment).
        r = d.request("GET", "/v1/sandboxes?metadata.suite=store&metadata.n=2")
        ids = [s["id"] for s in r.json()["sandboxes"]]
        assert other in ids and sid not in ids, r
        r = d.request("PATCH", f"/v1/sandboxes/{sid}", {"ttl_seconds": 600})
        assert r.status == 200, r
        (exp,) = sql(pg, f"SELECT expires_at_ms FROM core_sandboxes WHERE id = '{sid}'")[0]
        assert abs(int(exp) / 1000 - (time.time() + 600)) < 60, exp
        rows = dict((r[0], r[1:]) for r in sql(pg, "SELECT id, state, host_id FROM core_sandboxes"))
        assert rows[sid] == ["running", "pg-a"], rows
        assert d.delete(sid).status == 204
        assert sql(pg, f"SELECT state FROM core_sandboxes WHERE id = '{sid}'") == [["stopped"]]
        kinds = [k for (k,) in sql(pg, f"SELECT kind FROM core_events WHERE sandbox_id = '{sid}' ORDER BY seq")]
        assert kinds[0] == "created" and kinds[-1] == "stopped", kinds
        assert d.request("GET", f"/v1/sandboxes/{sid}").status == 404
    finally:
        d.cleanup()


def test_bad_host_id_is_refused_at_start(pg):
    d = Daemon(extra_args=[*ARGS, "--db", pg.dsn, "--host-id", "Not A/Host"])
    try:
        with pytest.raises(RuntimeError, match="host id"):
            d.start()
        assert sql(pg, "SELECT count(*) FROM core_leases WHERE owner = 'Not A/Host'") == [["0"]]
    finally:
        d.stop()  # a failed start removed its data dir (harness)


def test_restart_readopts_from_postgres(pg):
    d = daemon(pg, "pg-r")
    sid = d.create(ttl_seconds=300)
    d.put_file(sid, "/work/kept.txt", b"kept")
    (epoch1,) = sql(pg, "SELECT epoch FROM core_leases WHERE resource = 'host:pg-r'")[0]
    d.crash()
    d2 = daemon(pg, "pg-r", restart_of=d)
    d2.created |= d.created
    try:
        (epoch2,) = sql(pg, "SELECT epoch FROM core_leases WHERE resource = 'host:pg-r'")[0]
        assert int(epoch2) == int(epoch1) + 1
        assert d2.request("GET", f"/v1/sandboxes/{sid}").json()["state"] == "running"
        assert d2.exec(sid, "cat /work/kept.txt")["stdout"] == "kept"
    finally:
        d2.cleanup()


def test_two_hosts_leave_each_other_alone(pg):
    a = daemon(pg, "pg-h1")
    b = None
    try:
        sa = a.create(ttl_seconds=300)
        # b's reconcile and reaper run over a database holding a's live
        # sandbox that b cannot reach: it must not mark it lost.
        b = daemon(pg, "pg-h2")
        sb = b.create(ttl_seconds=300)
        time.sleep(1.5)  # a few reaper ticks on both
        assert sql(pg, f"SELECT state, host_id FROM core_sandboxes WHERE id = '{sa}'") == [["running", "pg-h1"]]
        assert a.exec(sa, "echo a")["stdout"] == "a\n"
        assert b.exec(sb, "echo b")["stdout"] == "b\n"
        # A stop sent to the other host is forwarded to the owner
        # (tests/store/test_hosts.py has the rest of routing).
        assert b.request("DELETE", f"/v1/sandboxes/{sa}").status == 204
        assert sql(pg, f"SELECT state FROM core_sandboxes WHERE id = '{sa}'") == [["stopped"]]
        a.wait_no_leftovers(timeout=30, net=False)
    finally:
        if b:
            b.cleanup()
        a.cleanup()


def test_fenced_host_kills_its_sandboxes_and_refuses_work(pg):
    old = daemon(pg, "pg-f")
    new = None
    try:
        sid = old.create(ttl_seconds=300)
        (e_old,) = sql(pg, "SELECT epoch FROM core_leases WHERE resource = 'host:pg-f'")[0]
        # Another incarnation with the same identity takes the lease over.
        new = daemon(pg, "pg-f")
        (e_new,) = sql(pg, "SELECT epoch FROM core_leases WHERE resource = 'host:pg-f'")[0]
        assert int(e_new) == int(e_old) + 1
        # Every write of the old one is refused from now on: a create
        # answers 503 with Retry-After at once.
        r = old.request("POST", "/v1/sandboxes", {"ttl_seconds": 60})
        assert r.error_code() == "store_unavailable" and "Retry-After" in {k.title(): v for k, v in r.headers.items()}, r
        old.wait_no_leftovers(timeout=30, net=False)
        # The old host's late writes were refused: every event after the
        # takeover carries the new epoch, none the old one.
        evs = sql(pg, f"SELECT kind, epoch FROM core_events WHERE sandbox_id = '{sid}' ORDER BY seq")
        after = [e for (k, e) in evs[[k for k, _ in evs].index("stopped"):]]
        assert all(int(e) == int(e_new) for e in after), evs
        # Within a lease check (every 2 s) the old one learns it lost the
        # lease and kills what it still runs.
        wait_for(lambda: "lease taken over" in open(old.log_path, errors="replace").read(),
                 timeout=40, what="old host noticing the takeover")
        old.wait_no_leftovers(timeout=30, net=False)
    finally:
        if new:
            new.cleanup()
        old.cleanup()


def test_database_down_answers_503_and_the_host_kills_its_sandboxes():
    """PostgreSQL dies under a running daemon: the API answers 503 with
    Retry-After (never hangs), and before the host's lease could expire
    the daemon kills its own sandboxes. Restarted, the database serves a
    restarted daemon again."""
    own = Postgres(db="hxdown").start()
    d = None
    try:
        d = daemon(own, "pg-down")
        sid = d.create(ttl_seconds=300)
        own.kill()
        started = time.time()
        r = d.request("GET", f"/v1/sandboxes/{sid}", timeout=30)
        assert r.status == 503 and r.error_code() == "store_unavailable", r
        assert "retry-after" in {k.lower() for k in r.headers}, r.headers
        assert time.time() - started < 25
        # Lease lifetime 30 s, renewals every 10 s: the sandbox is gone
        # well within the lifetime (counted from the last renewal).
        d.wait_no_leftovers(timeout=45, net=False)
        wait_for(lambda: "killing this host's sandboxes" in open(d.log_path, errors="replace").read(),
                 timeout=10, what="the lease-loss log line")
        own.start()
        d.crash()
        d2 = daemon(own, "pg-down", restart_of=d)
        d2.created |= d.created
        d = d2
        assert d.request("GET", f"/v1/sandboxes/{sid}").status == 404
        sid2 = d.create(ttl_seconds=60)
        assert d.exec(sid2, "echo up")["stdout"] == "up\n"
    finally:
        if d:
            d.cleanup()
        own.stop()


def test_a_database_not_up_at_start_is_waited_for_with_backoff():
    """hatcheryd started before its PostgreSQL: it retries with backoff,
    logging each attempt (for up to 60 s), and serves once the database is
    up; nothing is needed but starting the database."""
    # The database that initdb makes: it exists the moment the server
    # accepts connections (a createdb afterwards would race the daemon).
    own = Postgres(db="postgres")
    d = Daemon(extra_args=[*ARGS, "--db", own.dsn, "--host-id", "pg-late"])
    late = threading.Timer(3.0, own.start)
    try:
        late.start()
        t0 = time.time()
        d.start()
        took = time.time() - t0
        late.join()
        log = open(d.log_path, errors="replace").read()
        # The first thing a daemon opens is the deployment's database.
        assert log.count("database store not reachable yet") >= 2, log[-2000:]
        assert took >= 3, took
        sid = d.create(ttl_seconds=60)
        assert d.exec(sid, "echo up")["stdout"] == "up\n"
        print(f"daemon up {took:.1f}s after start, database started at 3 s")
    finally:
        late.cancel()
        late.join()
        d.cleanup()
        own.stop()

