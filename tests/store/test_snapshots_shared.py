"""Snapshots in a store every host mounts (--snapshot-store shared:<dir>),
on one PostgreSQL (tests/pg/pg.py) with one control plane and two hosts
that share it, plus one host on the default local store.

A snapshot taken on host A outlives A: after A is SIGKILLed, a fork
through the control plane lands on B with the file written in A's sandbox
there; GET and DELETE are served by any host; the delete leaves nothing in
the shared dir. An expired shared snapshot is deleted by exactly one of
the hosts sweeping it. A local-store snapshot of a lost host still answers
503 (host_lost once the host is marked). Teardown as in test_hosts.py:
every daemon checked for leftovers, killed hosts restarted to clean up
their network state."""

import os
import shutil
import sys
import tempfile
import threading
import time

import pytest

HERE = os.path.dirname(__file__)
sys.path.insert(0, HERE)

from test_hosts import ARGS, LOSS_WAIT, check_invariants, daemon, headers, no_net_leftovers, owner, pg, sql, warm  # noqa: E402,F401
from harness import KEY, Daemon, wait_for  # noqa: E402  (on the path test_hosts set)


def snapshot(d, sid, **body):
    r = d.request("POST", f"/v1/sandboxes/{sid}/snapshots", body)
    assert r.status == 201, r
    return r.json()["id"]


def location(pgs, snap):
    return sql(pgs, f"SELECT location, host_id FROM core_snapshots WHERE id = '{snap}'")


def deleted_logged(d, snap):
    return sum(1 for line in open(d.log_path, errors="replace")
               if "snapshot deleted" in line and snap in line)


def test_shared_snapshot_outlives_its_writer(pg):
    started = time.time()
    shared = tempfile.mkdtemp(prefix="hxss-", dir="/tmp")
    store = ["--snapshot-store", f"shared:{shared}"]
    a = daemon(pg, "ss-a", role="host", extra=store)
    b = daemon(pg, "ss-b", role="host", extra=store)
    lo = daemon(pg, "ss-l", role="host")  # the default, local store
    c = daemon(pg, "ss-ctl", role="control")
    a2 = lo2 = None
    try:
        sid = a.create(ttl_seconds=300)
        assert a.put_file(sid, "/work/kept.txt", b"written on a").status == 204
        snap = snapshot(a, sid, metadata={"suite": "shared"})
        assert location(pg, snap) == [["shared", "ss-a"]]
        # Published whole under its id; no staging dir left behind.
        assert os.listdir(shared) == [snap]
        files = set(os.listdir(os.path.join(shared, snap)))
        assert {"checkpoint.img", "manifest.json"} <= files, files

        lsid = lo.create(ttl_seconds=300)
        lsnap = snapshot(lo, lsid)
        assert location(pg, lsnap) == [["local:ss-l", "ss-l"]]
        assert os.listdir(shared) == [snap], "a local-store host writes to its own disk"

        # Expiry: both shared hosts sweep it; exactly one deletes it.
        bsid = b.create(ttl_seconds=300)
        short = snapshot(b, bsid, retention_seconds=1)
        wait_for(lambda: location(pg, short) == [] and short not in os.listdir(shared),
                 timeout=30, what="expired shared snapshot deleted")
        wait_for(lambda: deleted_logged(a, short) + deleted_logged(b, short) >= 1, timeout=10,
                 what="the deletion logged")
        time.sleep(1.5)  # a few more sweeps of both hosts
        assert deleted_logged(a, short) + deleted_logged(b, short) == 1
        assert sorted(os.listdir(shared)) == [snap]

        # The snapshots stay when their sandboxes go.
        for d, s in ((a, sid), (lo, lsid), (b, bsid)):
            assert d.delete(s).status == 204
            d.wait_no_leftovers(timeout=30, net=False)

        # Served by B itself (not forwarded to its writer).
        r = b.request("GET", f"/v1/snapshots/{snap}")
        assert r.status == 200 and r.json()["id"] == snap, r
        m = b.request("GET", "/metrics").body.decode()
        assert 'hatchery_route_requests_total{outcome="forwarded"}' not in m

        a.crash()
        lo.crash()
        # Placed like a create: A still looks alive (its heartbeat is
        # fresh), is tried first (tie by id) and is unreachable, so B.
        r = c.request("POST", f"/v1/snapshots/{snap}/fork", {"ttl_seconds": 300, "count": 1}, timeout=120)
        assert r.status == 201, r
        fid = r.json()["sandboxes"][0]["id"]
        b.created.add(fid)
        assert owner(pg, fid) == "ss-b"
        assert c.get_file(fid, "/work/kept.txt").body == b"written on a"

        # The local-store snapshot of a dead host: 503 until it is marked
        # lost, then 503 host_lost; never a 404 or a silent success.
        r = c.request("POST", f"/v1/snapshots/{lsnap}/fork", {"count": 1}, timeout=30)
        assert r.status == 503 and r.error_code() in ("host_unreachable", "host_lost"), r
        assert "retry-after" in headers(r)

        def lost():
            r = c.request("GET", f"/v1/snapshots/{lsnap}", timeout=30)
            assert r.status == 503, r
            return r.error_code() == "host_lost"
        wait_for(lost, timeout=LOSS_WAIT, what="local snapshot's host marked lost")
        # The lost host's shared snapshot is still everyone's.
        assert c.request("GET", f"/v1/snapshots/{snap}").json()["id"] == snap
        assert location(pg, snap) == [["shared", "ss-a"]], "lost_hosts left the row"

        # Deleted through the control plane, by whichever host: row and
        # files gone, nothing left in the shared dir.
        assert c.request("DELETE", f"/v1/snapshots/{snap}").status == 204
        assert location(pg, snap) == []
        assert os.listdir(shared) == [], os.listdir(shared)
        r = c.request("GET", f"/v1/snapshots/{snap}")
        assert r.status == 404 and r.error_code() == "snapshot_not_found", r
        assert snap in r.json()["error"]["message"], r
        assert b.request("DELETE", f"/v1/snapshots/{snap}").status == 204  # idempotent on a host
        assert b.delete(fid).status == 204
        b.wait_no_leftovers(timeout=30, net=False)
        check_invariants(pg, [sid, lsid, bsid, fid])

        # The killed hosts come back (same data and network) to clean up;
        # the local snapshot is served by its owner again and deleted.
        a2 = daemon(pg, "ss-a", role="host", extra=store, restart_of=a)
        a2.created |= a.created
        lo2 = daemon(pg, "ss-l", role="host", restart_of=lo)
        lo2.created |= lo.created
        assert c.request("DELETE", f"/v1/snapshots/{lsnap}").status == 204
        assert location(pg, lsnap) == []
        assert os.listdir(os.path.join(lo2.data_dir, "snapshots")) == []
        print(f"shared snapshot suite body {time.time() - started:.1f}s")
    finally:
        c.cleanup()
        b.cleanup()
        # A killed host's network state goes with a restart of it.
        if a2 is None and a.proc.poll() is not None:
            a2 = daemon(pg, "ss-a", role="host", extra=store, restart_of=a)
            a2.created |= a.created
        if lo2 is None and lo.proc.poll() is not None:
            lo2 = daemon(pg, "ss-l", role="host", restart_of=lo)
            lo2.created |= lo.created
        (a2 or a).cleanup()
        (lo2 or lo).cleanup()
        shutil.rmtree(shared, ignore_errors=True)
    no_net_leftovers(a, b, lo)


def test_a_fork_goes_where_the_snapshot_has_a_warm_pool(pg):
    """A shared snapshot's fork through the control plane is placed on the
    host with forks of it parked in its warm pool (the host reports
    `snapshot:ID` among its warm entries), and claims one there (boot_mode
    `pool`), though the other host comes first by every other rule (more
    free room, and the tie by id)."""
    shared = tempfile.mkdtemp(prefix="hxsp-", dir="/tmp")
    store = ["--snapshot-store", f"shared:{shared}"]
    a = daemon(pg, "sp-a", role="host", extra=store)
    b = daemon(pg, "sp-b", role="host", extra=store)
    c = daemon(pg, "sp-ctl", role="control")
    forks = []
    try:
        sid = a.create(ttl_seconds=300)
        assert a.put_file(sid, "/work/kept.txt", b"from a").status == 204
        snap = snapshot(a, sid)
        assert a.delete(sid).status == 204
        key = f"snapshot:{snap}"
        assert key not in warm(pg, "sp-a") + warm(pg, "sp-b")
        r = b.request("PUT", f"/v1/snapshots/{snap}/pool", {"size": 1})
        assert r.status == 200, r
        wait_for(lambda: b.request("GET", f"/v1/snapshots/{snap}/pool").json()["ready"] == 1,
                 timeout=60, what="b's pool of the snapshot ready")
        wait_for(lambda: key in warm(pg, "sp-b"), timeout=30, what="b reporting the pool warm")
        assert key not in warm(pg, "sp-a")
        r = c.request("POST", f"/v1/snapshots/{snap}/fork", {"ttl_seconds": 300, "count": 1}, timeout=120)
        assert r.status == 201, r
        f = r.json()["sandboxes"][0]
        forks.append(f["id"])
        b.created.add(f["id"])
        assert owner(pg, f["id"]) == "sp-b"
        assert f.get("boot_mode") == "pool", f
        assert c.get_file(f["id"], "/work/kept.txt").body == b"from a"
        # Its pool spent and not refilled yet or refilled: either way the
        # next fork is placed and served.
        r = c.request("POST", f"/v1/snapshots/{snap}/fork", {"ttl_seconds": 300, "count": 1}, timeout=120)
        assert r.status == 201, r
        g = r.json()["sandboxes"][0]["id"]
        forks.append(g)
        (b if owner(pg, g) == "sp-b" else a).created.add(g)
        assert b.request("PUT", f"/v1/snapshots/{snap}/pool", {"size": 0}).status == 200
        wait_for(lambda: key not in warm(pg, "sp-b"), timeout=30, what="b no longer reporting it")
        for fid in forks:
            assert c.request("DELETE", f"/v1/sandboxes/{fid}").status == 204
        assert c.request("DELETE", f"/v1/snapshots/{snap}").status == 204
        for d in (a, b):
            d.wait_no_leftovers(timeout=30, net=False)
        check_invariants(pg, [sid, *forks])
    finally:
        c.cleanup()
        b.cleanup()
        a.cleanup()
        shutil.rmtree(shared, ignore_errors=True)
    no_net_leftovers(a, b)


def test_a_paused_e2b_sandbox_is_resumed_once_across_hosts(pg):
    """With a shared snapshot store every host may resume a paused E2B
    sandbox, so two connects on two hosts at the same moment race for one
    snapshot. Exactly one restores it (201); the other waits out the claim
    and finds it running (200) or is told it is being resumed (409). Never
    two sandboxes under one E2B id."""
    shared = tempfile.mkdtemp(prefix="hxsr-", dir="/tmp")
    store = ["--snapshot-store", f"shared:{shared}"]
    a = daemon(pg, "sr-a", role="host", extra=store)
    b = daemon(pg, "sr-b", role="host", extra=store)
    e2b_key = {"X-API-Key": KEY}
    resumed = []
    try:
        r = a.request("POST", "/e2b/sandboxes", {"templateID": "code-interpreter", "timeout": 300},
                      auth=False, headers=e2b_key)
        assert r.status == 201, r
        sid = r.json()["sandboxID"]
        a.created.add(sid)
        assert a.put_file(sid, "/work/p.txt", b"before the pause").status == 204
        r = a.request("POST", f"/e2b/sandboxes/{sid}/pause", {}, auth=False, headers=e2b_key)
        assert r.status == 204, r
        assert sql(pg, f"SELECT location FROM core_snapshots WHERE metadata->>'e2b_paused_sandbox' = '{sid}'") \
            == [["shared"]]

        go = threading.Barrier(2)
        answers = {}

        def connect(d):
            go.wait()
            answers[d.port] = d.request("POST", f"/e2b/sandboxes/{sid}/connect", {"timeout": 300},
                                        auth=False, headers=e2b_key, timeout=120)
        threads = [threading.Thread(target=connect, args=(d,)) for d in (a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(150)
        statuses = sorted(r.status for r in answers.values())
        assert statuses in ([200, 201], [201, 409]), answers
        rows = sql(pg, "SELECT id, host_id FROM core_sandboxes WHERE state = 'running' "
                       f"AND metadata->>'e2b_sandbox_id' = '{sid}'")
        assert len(rows) == 1, rows
        resumed = rows[0]
        {"sr-a": a, "sr-b": b}[resumed[1]].created.add(resumed[0])
        assert sql(pg, f"SELECT count(*) FROM core_snapshots WHERE metadata->>'e2b_paused_sandbox' = '{sid}'") == [["0"]]
        # The claim was released: no lease of it is still held.
        assert sql(pg, "SELECT count(*) FROM core_leases WHERE resource = 'e2b-resume:" + sid + "' "
                       "AND expires_at_ms > (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT") == [["0"]]
        r = b.request("GET", "/e2b/sandbox/files?path=/work/p.txt", auth=False,
                      headers={"E2b-Sandbox-Id": sid, "X-Access-Token": answers[a.port].json().get("envdAccessToken")
                               or answers[b.port].json().get("envdAccessToken")})
        assert r.status == 200 and r.body == b"before the pause", r
        r = a.request("DELETE", f"/e2b/sandboxes/{sid}", auth=False, headers=e2b_key)
        assert r.status == 204, r
        check_invariants(pg, [sid, resumed[0]])
        assert os.listdir(shared) == [], os.listdir(shared)
    finally:
        b.cleanup()
        a.cleanup()
        shutil.rmtree(shared, ignore_errors=True)
    no_net_leftovers(a, b)


def test_bad_snapshot_store_is_a_start_error(pg):
    not_dir = tempfile.mkstemp(prefix="hxss-file-", dir="/tmp")[1]
    try:
        for value, why in [("shared:relative/dir", "invalid snapshot store"),
                           ("nfs:/mnt", "invalid snapshot store"),
                           ("shared:/nonexistent-hx-dir", "No such file"),
                           (f"shared:{not_dir}", "not a directory"),
                           ("shared:/proc", "not writable")]:
            d = Daemon(extra_args=[*ARGS, "--db", pg.dsn, "--host-id", "ss-bad", "--role", "host",
                                   "--snapshot-store", value])
            try:
                with pytest.raises(RuntimeError, match=why):
                    d.start()
            finally:
                d.stop()  # a failed start removed its data dir (harness)
    finally:
        os.unlink(not_dir)
    # Refused before it registered or took a lease (run after the test
    # above, so the tables exist).
    assert sql(pg, "SELECT count(*) FROM core_hosts WHERE id = 'ss-bad'") == [["0"]]
    assert sql(pg, "SELECT count(*) FROM core_leases WHERE resource = 'host:ss-bad'") == [["0"]]
