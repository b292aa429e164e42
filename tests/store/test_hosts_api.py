"""Hosts managed through the API on one PostgreSQL (tests/pg/pg.py), each
host in a network namespace of its own (hostnet.py): the control plane
lists them, a cordoned host gets no new sandboxes while the ones it runs
are still served, an uncordon restores it, a sandbox lost with its host
answers 410 sandbox_lost (through the control plane and through another
host), and the control plane's /readyz follows its hosts."""

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

from harness import ANSI, BIN_DIR, KEY, metric, wait_for  # noqa: E402
from pg import Postgres  # noqa: E402
from test_hosts import check_invariants, daemon, no_net_leftovers, owner, sql, wait_warm  # noqa: E402

# The shortest host lease (hatchery-core lease.rs): a stopped host is
# lost, and its sandboxes marked, within seconds.
LEASE = ["--host-lease-ttl", "6"]


@pytest.fixture(scope="module")
def pg():
    p = Postgres(db="hxhostsapi", fabric=True).start()
    yield p
    p.stop()


def readyz(d):
    r = d.request("GET", "/readyz", auth=False)
    return r.status, r.json()


def states(c):
    r = c.request("GET", "/v1/hosts")
    assert r.status == 200, r
    return {h["id"]: h["state"] for h in r.json()["hosts"]}


def assert_lost_said_everywhere(c, sid, host):
    """The SDKs, the CLI and E2B's API say a lost sandbox was lost (which
    host, when, why), not that it is unknown."""
    sys.path.insert(0, os.path.join(HERE, "..", "..", "sdk", "python"))
    import hatchery  # noqa: E402

    client = hatchery.Client(f"http://{c.addr}:{c.port}", KEY, max_retries=0)
    with pytest.raises(hatchery.SandboxLost) as e:
        hatchery.Sandbox.get(sid, client=client)
    err = e.value
    assert isinstance(err, hatchery.NotFound) and err.status == 410 and err.code == "sandbox_lost", err
    assert err.host == host and err.lost_at_ms > 0 and "heartbeat" in err.reason, vars(err)
    assert f"was lost with its host {host} at 20" in err.message, err.message
    # The CLI: its message, and a failing exit.
    env = dict(os.environ, HATCHERY_URL=f"http://{c.addr}:{c.port}", HATCHERY_API_KEY=KEY)
    r = subprocess.run([os.path.join(BIN_DIR, "hatchery"), "sandbox", "get", sid], env=env,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "410 sandbox_lost" in r.stderr and f"lost with its host {host} at 20" in r.stderr, r
    # E2B's API: its own 404 shape (its SDKs raise not-found), saying lost.
    r = c.request("GET", f"/e2b/sandboxes/{sid}")
    body = r.json()
    assert (r.status, body.get("code")) == (404, 404), (r, body)
    assert f"lost with its host {host}" in body["message"], body


def test_cordon_uncordon_lost_sandboxes_and_readiness(pg):
    h1 = daemon(pg, "ap-1", role="host", extra=LEASE)
    h2 = daemon(pg, "ap-2", role="host", extra=LEASE)
    c = daemon(pg, "ap-ctl", role="control", extra=LEASE)
    hosts = {"ap-1": h1, "ap-2": h2}
    h1b = None
    try:
        # Both warm, so only the hold and free room decide below.
        wait_warm(pg, hosts, "code-interpreter")
        status, body = readyz(c)
        assert status == 200 and [x["name"] for x in body["checks"]] == ["database", "ready_host"], body
        assert readyz(h1)[0] == 200
        assert [x["name"] for x in readyz(h1)[1]["checks"]] == ["reconciled", "listening", "not_stopping", "lease_held"]
        assert states(c) == {"ap-1": "ready", "ap-2": "ready"}
        # Every role answers the hosts API from the shared store.
        assert states(h2) == states(c)

        kept = h1.create(ttl_seconds=600)
        r = c.request("POST", "/v1/hosts/ap-1:cordon")
        assert (r.status, r.json()["state"]) == (200, "cordoned"), r
        sids = []
        for _ in range(10):
            r = c.request("POST", "/v1/sandboxes", {"ttl_seconds": 300})
            assert r.status == 201, r
            sids.append(r.json()["id"])
            h2.created.add(sids[-1])
        placed = [owner(pg, s) for s in sids]
        assert placed == ["ap-2"] * 10, placed
        # Still routed: the cordoned host's sandbox answers through control.
        assert c.exec(kept, "echo kept")["stdout"] == "kept\n"
        # Straight to the cordoned host: refused with its own code.
        r = h1.request("POST", "/v1/sandboxes", {"ttl_seconds": 60})
        assert (r.status, r.error_code()) == (503, "host_cordoned"), r
        listed = {h["id"]: h for h in c.request("GET", "/v1/hosts").json()["hosts"]}
        assert (listed["ap-1"]["state"], listed["ap-1"]["live_sandboxes"]) == ("cordoned", 1), listed
        assert listed["ap-2"]["live_sandboxes"] == 10, listed
        wait_for(lambda: metric(c, "hatchery_hosts", 'state="cordoned"') == 1
                 and metric(c, "hatchery_host_live_sandboxes", 'host="ap-2"') == 10,
                 timeout=15, what="control-plane gauges")
        # Both cordoned: control says no host is ready, and creates nothing.
        assert c.request("POST", "/v1/hosts/ap-2:cordon").status == 200
        r = c.request("POST", "/v1/sandboxes", {"ttl_seconds": 60})
        assert (r.status, r.error_code()) == (503, "no_ready_host"), r
        status, body = readyz(c)
        assert (status, body["failing"]) == (503, ["ready_host"]), body
        # Uncordon: placement comes back, to the emptier host.
        for h in ("ap-1", "ap-2"):
            r = c.request("POST", f"/v1/hosts/{h}:uncordon")
            assert (r.status, r.json()["state"]) == (200, "ready"), r
        r = c.request("POST", "/v1/sandboxes", {"ttl_seconds": 300})
        assert r.status == 201, r
        assert owner(pg, r.json()["id"]) == "ap-1"
        h1.created.add(r.json()["id"])
        back = r.json()["id"]
        check_invariants(pg, [kept, back, *sids])

        # ap-1 dies: its sandboxes are lost, and say so (410, when, why).
        h1.crash()
        killed = time.time()

        def gone():
            return c.request("GET", f"/v1/sandboxes/{kept}", timeout=30).status == 410
        wait_for(gone, timeout=60, what="sandbox_lost through control")
        r = c.request("GET", f"/v1/sandboxes/{kept}")
        err = r.json()["error"]
        assert (r.status, err["code"], err["host"], err["reason"] and True) == (410, "sandbox_lost", "ap-1", True), r
        assert err["lost_at_ms"] / 1000 >= killed - 1, err
        # Through another host, the same answer.
        r = h2.request("GET", f"/v1/sandboxes/{back}")
        assert (r.status, r.error_code()) == (410, "sandbox_lost"), r
        assert states(c)["ap-1"] == "lost"
        print(f"sandbox_lost {time.time() - killed:.1f}s after SIGKILL")
        assert_lost_said_everywhere(c, kept, "ap-1")
        # Listed as lost (through the control plane and another host), with
        # its host, when and why; the live listing no longer has it.
        for d in (c, h2):
            r = d.request("GET", "/v1/sandboxes?state=lost")
            assert r.status == 200, r
            lost = {s["id"]: s for s in r.json()["sandboxes"]}
            assert kept in lost and back in lost, lost
            k = lost[kept]
            assert (k["state"], k["host"], k["end_reason"]) == ("lost", "ap-1", "host_lost"), k
            assert k["ended_at"].startswith("20"), k
            live = {s["id"] for s in d.request("GET", "/v1/sandboxes").json()["sandboxes"]}
            assert kept not in live and not (set(sids) - live), live
        r = c.request("GET", "/v1/sandboxes?state=lost&limit=1")
        assert len(r.json()["sandboxes"]) == 1, r
        r = c.request("GET", "/v1/sandboxes?state=gone")
        assert (r.status, r.error_code()) == (400, "invalid_query"), r

        # The host comes back on its data directory: ready only after it
        # has reconciled (destroying what its shims still ran).
        h1b = daemon(pg, "ap-1", role="host", extra=LEASE, restart_of=h1)
        h1b.created |= h1.created
        assert states(c)["ap-1"] == "ready"
        h1b.wait_no_leftovers(timeout=30, net=False)
        log = h1b.log(tail=None)
        assert "reconciling this host's sandboxes" in log
        # Held through one more lease period after it became ready, and
        # never fenced (a reconcile longer than the lease:
        # test_reconcile_longer_than_the_lease_keeps_the_host).
        print("restart: lease taken, reconciled at",
              [line[:26] for line in log.splitlines()
               if "host lease taken" in line or "state reconciled with the host" in line][-2:])
        until = time.time() + 6 + 3
        while time.time() < until:
            assert states(c)["ap-1"] == "ready", states(c)
            assert readyz(h1b)[0] == 200, readyz(h1b)
            time.sleep(1)
        assert h1b.proc.poll() is None, h1b.log()
        after = h1b.log(tail=None)
        assert "host lease taken over" not in after and "about to expire unrenewed" not in after
        assert c.request("GET", f"/v1/sandboxes/{kept}").status == 410

        # Every host stopped: the control plane is not ready.
        h1b.cleanup()
        h2.cleanup()

        def not_ready():
            return readyz(c)[0] == 503
        wait_for(not_ready, timeout=30, what="control /readyz 503 with no host")
        status, body = readyz(c)
        assert body["failing"] == ["ready_host"] and body["ready"] is False, body
        # A stopped host is `draining` (stopping) at once, and `lost` once
        # its heartbeat is older than the lease.
        wait_for(lambda: set(states(c).values()) == {"lost"}, timeout=30, what="every stopped host lost")
    finally:
        c.cleanup()
        h2.cleanup()
        (h1b or h1).cleanup()
    no_net_leftovers(h1, h2)


def test_reconcile_longer_than_the_lease_keeps_the_host(pg):
    """A host restarted on its data directory takes its lease, then
    reconciles: here two of its guests hang (their freezer cgroups FROZEN
    while it was down), so reconciling waits out the agent's ping timeout
    (10 s, hatchery-core manager.rs) for each, 20 s in all, twice the
    lease. The lease is renewed while it reconciles (7060e7c): the host is
    never swept as lost, nothing it runs is marked lost, the healthy
    sandbox is adopted and the hung ones are stopped and destroyed."""
    lease = ["--host-lease-ttl", "10"]
    h = daemon(pg, "rl-1", role="host", extra=lease)
    c = daemon(pg, "rl-ctl", role="control", extra=lease)
    hb = None
    frozen = []
    try:
        sids = [h.create(ttl_seconds=600) for _ in range(3)]
        healthy, hung = sids[0], sids[1:]
        # Kept under their shims across a graceful stop (docs/operations.md).
        h.stop()
        for sid in hung:
            with open(f"/sys/fs/cgroup/freezer/{sid}/freezer.state", "w") as f:
                f.write("FROZEN")
            frozen.append(sid)
        seen = set()
        done = []

        def watch():  # what the control plane says of the host while it restarts
            while not done:
                seen.add(states(c).get("rl-1", "-"))
                time.sleep(0.5)
        t = threading.Thread(target=watch, daemon=True)
        t.start()
        try:
            hb = daemon(pg, "rl-1", role="host", extra=lease, restart_of=h)
        finally:
            done.append(1)
            t.join()
        hb.created |= h.created
        log = ANSI.sub("", hb.log(tail=None))
        took = [int(line.split("elapsed_ms=")[1].split()[0]) for line in log.splitlines()
                if " reconciled" in line and "elapsed_ms=" in line]
        assert took and took[-1] > 10_000, took  # longer than the lease, or this test proves nothing
        print(f"reconcile took {took[-1]} ms against a 10 s lease; states seen while it ran: {sorted(seen)}")
        assert "lost" not in seen, seen
        assert "host lease taken over" not in log and "about to expire unrenewed" not in log
        assert states(c)["rl-1"] == "ready"
        assert c.exec(healthy, "echo adopted")["stdout"] == "adopted\n"
        for sid in hung:
            r = c.request("GET", f"/v1/sandboxes/{sid}")
            assert r.status in (404, 410) or r.json()["state"] == "stopped", r
            assert not os.path.exists(f"/sys/fs/cgroup/freezer/{sid}"), sid
        frozen.clear()
        assert sql(pg, f"SELECT state FROM core_sandboxes WHERE id = '{healthy}'") == [["running"]]
    finally:
        for sid in frozen:  # never leave a frozen Sentry behind
            try:
                with open(f"/sys/fs/cgroup/freezer/{sid}/freezer.state", "w") as f:
                    f.write("THAWED")
            except OSError:
                pass
        c.cleanup()
        (hb or h).cleanup()
    no_net_leftovers(h)
