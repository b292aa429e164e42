"""More faults for many hosts on one PostgreSQL (tests/pg/pg.py), with the
invariants of test_hosts.py checked after each (imported, not copied):

- PostgreSQL SIGKILLed under two running hosts and a control plane, then
  restarted on the same data directory and port: while it is down every
  daemon answers 503 `store_unavailable` with Retry-After (never hangs);
  an outage shorter than a renewal period kills no sandbox and fences no
  host; afterwards creates, exec and deletes work on both hosts, no
  acknowledged create is lost and no epoch went backwards.
- Clock skew: two hosts under libfaketime (+10 min and -10 min wall clock)
  next to a host with the true clock. Leases and heartbeats are timed by
  the database's clock, so the skewed hosts keep their leases, are never
  marked lost, and their lost-host sweeps mark neither a healthy peer nor
  a dead one before its lease ran out.

Every daemon is checked for leftovers (harness.Daemon.cleanup) and, once
gone, for network namespaces, veths and its nftables table."""

import glob
import os
import subprocess
import sys
import threading
import time

import pytest

HERE = os.path.dirname(__file__)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, os.path.join(HERE, "..", "pg"))

from harness import wait_for  # noqa: E402
from pg import Postgres  # noqa: E402
from test_hosts import check_invariants, daemon, epoch, headers, no_net_leftovers, owner, sql, wait_warm  # noqa: E402

# hatchery-core lease.rs: the lease lives 30 s and is renewed every 10 s;
# a host that cannot renew kills its sandboxes once under 10 s are left.
# So an outage under 10 s must never cost a sandbox.
LEASE_TTL_S = 30
RENEW_EVERY_S = 10
# Bounds of the writer that keeps creating through the outage.
MAX_CREATES_DURING_OUTAGE = 10
LOSS_WAIT = 75
KILL_LINE = "killing this host's sandboxes"
LOST_LINE = "host lost: its sandboxes marked stopped"


@pytest.fixture(scope="module")
def pg():
    p = Postgres(db="hxfaults", fabric=True).start()
    yield p
    p.stop()


def log_of(d):
    return d.log(tail=None)


def db_now_ms(pg):
    return int(sql(pg, "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint")[0][0])


def restart_postgres(pg):
    """pg_ctl start on the same data directory and port, once the killed
    postmaster's backends are gone (they exit when it dies, but a new
    postmaster refuses to start while one still holds shared memory)."""
    last = None
    for _ in range(40):
        try:
            return pg.start()
        except subprocess.CalledProcessError as e:
            last = e.stdout + e.stderr
            time.sleep(0.25)
    raise RuntimeError(f"PostgreSQL did not restart: {last}")


def assert_store_unavailable(r):
    assert r.status == 503 and r.error_code() == "store_unavailable", r
    assert "retry-after" in headers(r), r.headers


def test_postgres_killed_and_restarted_under_two_hosts(pg):
    h1 = daemon(pg, "pk-1", role="host")
    h2 = daemon(pg, "pk-2", role="host")
    c = daemon(pg, "pk-ctl", role="control")
    hosts = {"pk-1": h1, "pk-2": h2}
    acknowledged = []
    stop = threading.Event()
    try:
        # One sandbox on each host, placed by the control plane. A host
        # that has not yet reported its checkpoint warm ranks after one
        # that has (seen under load: both went to pk-1), so wait for both.
        wait_warm(pg, list(hosts), "code-interpreter")
        for _ in range(2):
            r = c.request("POST", "/v1/sandboxes", {"ttl_seconds": 600, "metadata": {"suite": "faults"}})
            assert r.status == 201, r
            sid = r.json()["id"]
            hosts[owner(pg, sid)].created.add(sid)
            acknowledged.append(sid)
        assert {owner(pg, s) for s in acknowledged} == {"pk-1", "pk-2"}
        before = {h: epoch(pg, h) for h in hosts}
        assert all(e > 0 for e in before.values()), before

        # A writer that keeps creating through the outage (bounded): each
        # answer is a 201 (the row must survive) or a 503 (nothing may be
        # left behind for it: the cleanups' leftover checks see that).
        answers = []

        def writer():
            while not stop.is_set() and len(answers) < MAX_CREATES_DURING_OUTAGE:
                r = c.request("POST", "/v1/sandboxes", {"ttl_seconds": 600}, timeout=60)
                answers.append(r)
                if r.status == 201:
                    sid = r.json()["id"]
                    acknowledged.append(sid)
                time.sleep(1.0)

        t = threading.Thread(target=writer, daemon=True)
        t.start()
        time.sleep(0.3)
        pg.kill()
        down_at = time.time()
        # While it is down: each daemon answers 503 store_unavailable with
        # Retry-After, within the request's bound instead of hanging.
        asked = 0
        for d in (c, h1, h2):
            for method, path, body in [("POST", "/v1/sandboxes", {"ttl_seconds": 60}),
                                       ("GET", "/v1/sandboxes", None),
                                       ("GET", f"/v1/sandboxes/{acknowledged[0]}", None)]:
                r = d.request(method, path, body, timeout=30)
                assert_store_unavailable(r)
                asked += 1
        # A sandbox's own exec does not need the database... unless the
        # daemon must look up who owns it: either it runs, or it is a 503.
        r = h1.request("POST", f"/v1/sandboxes/{acknowledged[0]}/exec", {"cmd": "echo up"}, timeout=30)
        assert r.status == 200 or r.error_code() == "store_unavailable", r
        exec_while_down = r.status
        # Keep it down a few seconds (well under a renewal period).
        while time.time() - down_at < 4:
            time.sleep(0.2)
        restart_postgres(pg)
        downtime = time.time() - down_at
        assert downtime < RENEW_EVERY_S, f"the outage took {downtime:.1f}s: a host could rightly give up its lease"

        # Every daemon serves again once its pool reconnects.
        for d in (c, h1, h2):
            wait_for(lambda d=d: d.request("GET", "/v1/sandboxes", timeout=30).status == 200,
                     timeout=30, what="API serving again after the restart")
        # Let the writer see the database back (a create or two acknowledged).
        wait_for(lambda: any(r.status == 201 for r in answers) or not t.is_alive(), timeout=60,
                 what="a create acknowledged after the restart")
        stop.set()
        t.join(timeout=90)
        assert not t.is_alive()
        for r in answers:
            assert r.status == 201 or r.error_code() in ("store_unavailable", "capacity"), r
        for sid in acknowledged:
            hosts[owner(pg, sid)].created.add(sid)

        # Neither host gave up its sandboxes or its lease: the same epochs,
        # no host_lost, the sandboxes from before the outage still run.
        after = {h: epoch(pg, h) for h in hosts}
        assert after == before, (before, after)
        assert sql(pg, "SELECT count(*) FROM core_sandboxes WHERE end_reason = 'host_lost'") == [["0"]]
        for d in (h1, h2, c):
            assert KILL_LINE not in log_of(d), d.log()
            assert LOST_LINE not in log_of(d), d.log()
        for sid in acknowledged:
            assert sql(pg, f"SELECT state FROM core_sandboxes WHERE id = '{sid}'") == [["running"]], sid
            assert c.exec(sid, "echo alive")["stdout"] == "alive\n"
        # Creates, exec and deletes on both hosts.
        for h, d in hosts.items():
            sid = d.create(ttl_seconds=120)
            assert owner(pg, sid) == h
            acknowledged.append(sid)
            assert d.exec(sid, "echo fresh")["stdout"] == "fresh\n"
            assert c.delete(sid).status == 204
        check_invariants(pg, acknowledged)
        assert {h: epoch(pg, h) for h in hosts} == before
        created_during = sum(1 for r in answers if r.status == 201)
        assert created_during >= 1, answers
        print(f"postgres down {downtime:.1f}s; {asked} requests answered 503 store_unavailable while down; "
              f"exec on its host while down: {exec_while_down}; writer: {len(answers)} creates, {created_during} acknowledged, all kept")
    finally:
        stop.set()
        c.cleanup()
        h2.cleanup()
        h1.cleanup()
    no_net_leftovers(h1, h2)


def faketime_env(offset):
    """libfaketime (Debian package faketime): the wall clock moved by
    `offset`; CLOCK_MONOTONIC left alone (tokio's timers use it)."""
    libs = glob.glob("/usr/lib/*/faketime/libfaketime.so.1")
    if not libs:
        raise RuntimeError("libfaketime not found (scripts/setup-host.sh installs faketime)")
    return {"LD_PRELOAD": libs[0], "FAKETIME": offset, "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "FAKETIME_NO_CACHE": "1"}


def skewed_daemon(pg, host, offset, monkeypatch):
    with monkeypatch.context() as m:
        for k, v in faketime_env(offset).items():
            m.setenv(k, v)
        return daemon(pg, host, role="host")


def test_skewed_hosts_keep_leases_and_mark_peers_by_the_database_clock(pg, monkeypatch):
    ok = daemon(pg, "sk-ok", role="host")
    fast = skewed_daemon(pg, "sk-fast", "+10m", monkeypatch)
    slow = skewed_daemon(pg, "sk-slow", "-10m", monkeypatch)
    ds = {"sk-ok": ok, "sk-fast": fast, "sk-slow": slow}
    ok2 = None
    try:
        sids = {h: d.create(ttl_seconds=1800) for h, d in ds.items()}
        # The skew is real: each host stamps created_at with its own clock.
        now = db_now_ms(pg)
        for h, shift in (("sk-ok", 0), ("sk-fast", 600_000), ("sk-slow", -600_000)):
            created = int(sql(pg, f"SELECT created_at_ms FROM core_sandboxes WHERE id = '{sids[h]}'")[0][0])
            assert abs(created - (now + shift)) < 120_000, (h, created - now)
        before = {h: epoch(pg, h) for h in ds}
        # Two renewals and about seven sweeps by every host.
        time.sleep(2 * RENEW_EVERY_S + 1)
        for h, d in ds.items():
            assert d.exec(sids[h], "echo ok")["stdout"] == "ok\n", h
            assert KILL_LINE not in log_of(d), d.log()
            assert LOST_LINE not in log_of(d), d.log()
        assert {h: epoch(pg, h) for h in ds} == before
        # Every lease valid by the database's clock, every heartbeat fresh.
        for h in ds:
            left, silent = sql(pg, f"""SELECT l.expires_at_ms - (extract(epoch FROM clock_timestamp()) * 1000)::bigint,
                                              (extract(epoch FROM clock_timestamp()) * 1000)::bigint - h.heartbeat_at_ms
                                       FROM core_leases l JOIN core_hosts h ON l.resource = 'host:' || h.id WHERE h.id = '{h}'""")[0]
            assert 0 < int(left) <= LEASE_TTL_S * 1000, (h, left)
            assert 0 <= int(silent) < LEASE_TTL_S * 1000, (h, silent)
        assert sql(pg, "SELECT count(*) FROM core_sandboxes WHERE end_reason = 'host_lost'") == [["0"]]
        # Through a skewed host, the others' sandboxes are reachable.
        assert fast.exec(sids["sk-slow"], "echo via-fast")["stdout"] == "via-fast\n"
        assert slow.exec(sids["sk-fast"], "echo via-slow")["stdout"] == "via-slow\n"

        # Now the true-clock host dies: only the skewed hosts sweep. They
        # mark it lost, but not before its lease could have run out (its
        # last heartbeat was at most a renewal period before the kill).
        ok.crash()
        killed = time.time()
        wait_for(lambda: sql(pg, f"SELECT state, end_reason FROM core_sandboxes WHERE id = '{sids['sk-ok']}'")
                 == [["stopped", "host_lost"]], timeout=LOSS_WAIT, what="dead peer marked lost by a skewed host")
        marked_after = time.time() - killed
        assert marked_after >= LEASE_TTL_S - RENEW_EVERY_S - 1, marked_after
        assert LOST_LINE in log_of(fast) + log_of(slow)
        for h in ("sk-fast", "sk-slow"):
            assert sql(pg, f"SELECT state FROM core_sandboxes WHERE id = '{sids[h]}'") == [["running"]], h
            assert epoch(pg, h) == before[h]
        # Its restart (same data dir and network) destroys what its shims
        # still ran and resurrects nothing.
        ok2 = daemon(pg, "sk-ok", role="host", restart_of=ok)
        ok2.created |= ok.created
        ok2.wait_no_leftovers(timeout=30, net=False)
        assert sql(pg, f"SELECT state FROM core_sandboxes WHERE id = '{sids['sk-ok']}'") == [["stopped"]]
        check_invariants(pg, list(sids.values()))
        print(f"skewed hosts (+10m, -10m) kept their leases; dead peer marked lost {marked_after:.1f}s after SIGKILL")
    finally:
        slow.cleanup()
        fast.cleanup()
        (ok2 or ok).cleanup()
        drop_faketime_leftovers()
    no_net_leftovers(ok, fast, slow)


def drop_faketime_leftovers():
    """libfaketime gives every process it is loaded into (the daemon and
    each child it starts) a semaphore and a shared-memory segment in
    /dev/shm, removed at exit; a process killed or torn down by signal
    leaves them. Those of processes that are gone are removed here."""
    for f in glob.glob("/dev/shm/faketime_shm_*") + glob.glob("/dev/shm/sem.faketime_sem_*"):
        pid = f.rsplit("_", 1)[-1]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            try:
                os.unlink(f)
            except FileNotFoundError:
                pass


CUT_TABLE = f"hxtestcut{os.getpid()}"
# A store call on a database that does not answer ends within 5 s
# (hatchery-store bounded.rs); a request makes at most a few of them.
UNANSWERED_BOUND_S = 16


def cut(pg, addr):
    """Drops every packet between the host at `addr` (its namespace's
    address on the bridge, hostnet.py) and the database's port: that host
    loses the database without a reset (its connections stall), while its
    API stays reachable and every other host keeps the database. A table
    of the test's own in the root namespace, removed by uncut()."""
    rules = (f"table inet {CUT_TABLE} {{\n"
             f" chain in {{\n type filter hook input priority -10; policy accept;\n"
             f" ip saddr {addr} tcp dport {pg.port} drop\n }}\n"
             f" chain out {{\n type filter hook output priority -10; policy accept;\n"
             f" ip daddr {addr} tcp sport {pg.port} drop\n }}\n}}\n")
    subprocess.run(["nft", "-f", "-"], input=rules, text=True, check=True)


def uncut():
    subprocess.run(["nft", "delete", "table", "inet", CUT_TABLE], capture_output=True)


def test_host_cut_off_from_the_database_by_nftables(pg):
    a = daemon(pg, "cut-a", role="host")
    b = daemon(pg, "cut-b", role="host")
    c = daemon(pg, "cut-ctl", role="control")
    a2 = None
    try:
        sa, sb = a.create(ttl_seconds=600), b.create(ttl_seconds=600)
        assert (owner(pg, sa), owner(pg, sb)) == ("cut-a", "cut-b")
        before = {h: epoch(pg, h) for h in ("cut-a", "cut-b")}
        cut(pg, a.addr)
        cut_at = time.time()
        # The cut host answers what needs the database with a 503 within
        # the bound, instead of hanging on its stalled connections.
        t0 = time.time()
        r = a.request("GET", "/v1/sandboxes", timeout=60)
        took = time.time() - t0
        assert_store_unavailable(r)
        assert took < UNANSWERED_BOUND_S, took
        # The rest of the deployment keeps working, the cut host's
        # sandbox included until its host gives it up.
        assert b.exec(sb, "echo b")["stdout"] == "b\n"
        assert c.request("GET", f"/v1/sandboxes/{sb}").status == 200
        # It cannot renew: it kills its own sandboxes while its lease is
        # still its own and unexpired, so nobody can have taken it over.
        wait_for(lambda: KILL_LINE in log_of(a), timeout=LEASE_TTL_S + 10, what="the cut host giving up")
        gave_up_after = time.time() - cut_at
        owner_now, ep, left = sql(pg, """SELECT owner, epoch, expires_at_ms - (extract(epoch FROM clock_timestamp())
                                          * 1000)::bigint FROM core_leases WHERE resource = 'host:cut-a'""")[0]
        assert (owner_now, int(ep)) == ("cut-a", before["cut-a"]), (owner_now, ep)
        assert int(left) > 0, f"the lease ran out {-int(left)} ms before the host gave up"
        a.wait_no_leftovers(timeout=30, net=False)
        # Once its lease ran out, the others mark its sandbox lost; the
        # healthy host's sandbox is untouched.
        wait_for(lambda: sql(pg, f"SELECT state, end_reason FROM core_sandboxes WHERE id = '{sa}'")
                 == [["stopped", "host_lost"]], timeout=LOSS_WAIT, what="the cut host's sandbox marked lost")
        marked_after = time.time() - cut_at
        assert epoch(pg, "cut-a") > before["cut-a"]
        assert sql(pg, f"SELECT state FROM core_sandboxes WHERE id = '{sb}'") == [["running"]]
        assert epoch(pg, "cut-b") == before["cut-b"]
        r = c.request("GET", f"/v1/sandboxes/{sa}")
        assert (r.status, r.error_code()) == (410, "sandbox_lost"), r
        # Back on the network it stays fenced (it gave up), until restarted.
        uncut()
        r = a.request("POST", "/v1/sandboxes", {"ttl_seconds": 60}, timeout=30)
        assert r.status == 503, r
        a.stop()
        a2 = daemon(pg, "cut-a", role="host", restart_of=a)
        a2.created |= a.created
        s2 = a2.create(ttl_seconds=120)
        assert a2.exec(s2, "echo back")["stdout"] == "back\n"
        assert epoch(pg, "cut-a") > before["cut-a"]
        check_invariants(pg, [sa, sb, s2])
        print(f"cut host: 503 in {took:.1f}s, gave up {gave_up_after:.1f}s after the cut (lease still its own, "
              f"{int(left)} ms left), marked lost {marked_after:.1f}s after the cut")
    finally:
        uncut()
        c.cleanup()
        b.cleanup()
        (a2 or a).cleanup()
    no_net_leftovers(a, b)
