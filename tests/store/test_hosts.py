"""Many hosts on one PostgreSQL (tests/pg/pg.py): requests routed to the
host that owns a sandbox, the control role placing creates (a warm
checkpoint of the template first, then the fewest of the tenant's
sandboxes, then free capacity), and host loss (SIGKILL; SIGSTOP past the lease TTL, then
SIGCONT) with the invariants checked after each fault: every acknowledged
create has its row, lease epochs only grow, events of a sandbox never go
back to an older epoch, no host runs more than its capacity, and a lost
host's sandboxes are stopped with reason host_lost and never come back.
Every daemon is checked for leftovers (harness.Daemon.cleanup), and the
network namespaces and nftables tables of every host once all are gone."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, os.path.join(HERE, "..", "pg"))

from harness import KEY, Daemon, arg, metric, net_leftovers, wait_for  # noqa: E402

sys.path.insert(0, os.path.join(HERE, "..", "sdk"))
import support  # noqa: E402
from hostnet import HostNet  # noqa: E402
from pg import Postgres, pg_bin  # noqa: E402
from guest_servers import HTTP_ECHO, start_guest_server  # noqa: E402
from wsclient import Term, WebSocket  # noqa: E402

ARGS = ["--max-ttl", "3600", "--pool-size", "0"]
# The host lease lives 30 s (hatchery-core lease.rs); the control plane
# sweeps every 3 s. A lost host is marked well within this.
LOSS_WAIT = 75


@pytest.fixture(scope="module")
def pg():
    p = Postgres(db="hxhosts", fabric=True).start()
    yield p
    p.stop()


def sql(pg, q):
    r = subprocess.run(["runuser", "-u", "postgres", "--", pg_bin("psql"), "-h", pg.dir, "-p", str(pg.port),
                        "-d", pg.db, "-AtF", "|", "-c", q], capture_output=True, text=True, check=True)
    return [line.split("|") for line in r.stdout.splitlines() if line]


def host_netns(host, restart_of=None):
    """A host runs in a network namespace of its own (hostnet.py); one
    restarted on its data directory, in the one it ran in before."""
    return restart_of.netns if restart_of is not None else HostNet(host)


def started(d):
    try:
        return d.start()
    except Exception:
        d.stop()
        if d.netns:
            d.netns.delete()
        raise


def daemon(pg, host, role="all", extra=(), restart_of=None, templates_dir=None):
    """A daemon on the suite's database: a host (or `all`) in a network
    namespace of its own, reaching the database over the bridge; the
    control plane in the root namespace, reaching hosts over the bridge."""
    netns = None if role == "control" else host_netns(host, restart_of)
    args = [*ARGS, "--db", pg.fabric_dsn if netns else pg.dsn, "--host-id", host, "--role", role, *extra]
    if restart_of is not None:
        for flag in ("--net-prefix", "--net-range"):
            args += [flag, arg(restart_of.extra_args, flag)]
    return started(Daemon(extra_args=args, data_dir=restart_of.data_dir if restart_of else None,
                          templates_dir=templates_dir, netns=netns))


def warm(pg, host):
    """The templates `host` last reported warm checkpoints of."""
    r = sql(pg, f"SELECT warm_templates FROM core_hosts WHERE id = '{host}'")
    return json.loads(r[0][0]) if r else []


def wait_warm(pg, hosts, template):
    # A host reports a checkpoint within a lease check (2 s) of baking it.
    for h in hosts:
        wait_for(lambda: template in warm(pg, h), timeout=60, what=f"{h} reporting {template} warm")


def owner(pg, sid):
    return sql(pg, f"SELECT host_id FROM core_sandboxes WHERE id = '{sid}'")[0][0]


def headers(r):
    return {k.lower(): v for k, v in r.headers.items()}


def check_invariants(pg, acknowledged):
    """Checked after every fault."""
    # No acknowledged create lost.
    rows = {i for (i,) in sql(pg, "SELECT id FROM core_sandboxes")}
    assert set(acknowledged) <= rows, set(acknowledged) - rows
    # A sandbox's events never go back to an older epoch of its host.
    for (sid,) in sql(pg, "SELECT DISTINCT sandbox_id FROM core_events"):
        eps = [int(e) for (e,) in sql(pg, f"SELECT epoch FROM core_events WHERE sandbox_id = '{sid}' ORDER BY seq")]
        assert eps == sorted(eps), (sid, eps)
    # No host over its capacity.
    for h, cap, live in sql(pg, """SELECT h.id, h.capacity, (SELECT count(*) FROM core_sandboxes s
                                   WHERE s.host_id = h.id AND s.state IN ('starting','running')) FROM core_hosts h"""):
        assert int(live) <= int(cap), (h, cap, live)


def epoch(pg, host):
    r = sql(pg, f"SELECT epoch FROM core_leases WHERE resource = 'host:{host}'")
    return int(r[0][0]) if r else 0


def no_net_leftovers(*ds):
    """Once the daemons are gone: their slots, tables and namespaces."""
    for d in ds:
        ns = d.netns.name if d.netns else None
        assert net_leftovers(d.net_prefix, ns) == [], d.net_prefix
        if d.netns:
            assert d.netns.leftovers() == [], d.netns.name


def test_roles_need_postgres():
    for role in ("control", "host"):
        d = Daemon(extra_args=[*ARGS, "--role", role])
        try:
            with pytest.raises(RuntimeError, match="needs --db postgres"):
                d.start()
        finally:
            d.stop()  # a failed start removed its data dir (harness)


def test_requests_are_routed_to_the_owning_host(pg):
    a = daemon(pg, "rt-a")
    b = daemon(pg, "rt-b")
    a2 = None
    try:
        sid = a.create(ttl_seconds=300)
        assert owner(pg, sid) == "rt-a"
        # Each host in its own network namespace: registered at its address
        # on the bridge, its sandbox's veth in its namespace, not the root's.
        for d, h in ((a, "rt-a"), (b, "rt-b")):
            assert sql(pg, f"SELECT address FROM core_hosts WHERE id = '{h}'") == [[f"{d.addr}:{d.port}"]]
        inside = subprocess.run(["ip", "-n", a.netns.name, "-o", "link"], capture_output=True, text=True).stdout
        root = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        assert f"hx{a.net_prefix}." in inside and f"hx{a.net_prefix}." not in root, inside
        # exec, files and the pty, all sent to b, served by a.
        assert b.exec(sid, "hostname >/dev/null; echo via-b")["stdout"] == "via-b\n"
        assert b.put_file(sid, "/work/b.txt", b"written via b").status == 204
        assert a.get_file(sid, "/work/b.txt").body == b"written via b"
        assert b.get_file(sid, "/work/b.txt").body == b"written via b"
        assert b.request("GET", f"/v1/sandboxes/{sid}").json()["state"] == "running"
        t = Term(WebSocket(b.port, f"/v1/sandboxes/{sid}/pty", {"Authorization": f"Bearer {KEY}"}, host=b.addr))
        t.type("echo pty-$((6*7))\r")
        t.wait_for("pty-42", timeout=30)
        t.ws.sock.close()
        # The forwarded ones were counted on b.
        m = b.request("GET", "/metrics").body.decode()
        assert 'hatchery_route_requests_total{outcome="forwarded"}' in m, m[:2000]
        # Without the key nothing is forwarded: b itself refuses.
        assert b.request("GET", f"/v1/sandboxes/{sid}", auth=False).status == 401
        # A delete sent to b really deletes on a.
        assert b.delete(sid).status == 204
        assert sql(pg, f"SELECT state FROM core_sandboxes WHERE id = '{sid}'") == [["stopped"]]
        a.wait_no_leftovers(timeout=30, net=False)
        assert b.request("GET", f"/v1/sandboxes/{sid}").status == 404

        # The owner is down (SIGKILL; its shims keep the sandbox): b
        # answers 503 with Retry-After, never a silent success.
        sid2 = a.create(ttl_seconds=300)
        a.crash()
        for method, path, body in [("POST", f"/v1/sandboxes/{sid2}/exec", {"cmd": "true"}),
                                   ("DELETE", f"/v1/sandboxes/{sid2}", None),
                                   ("GET", f"/v1/sandboxes/{sid2}", None)]:
            r = b.request(method, path, body, timeout=30)
            assert r.status == 503 and r.error_code() == "host_unreachable", r
            assert "retry-after" in headers(r), r.headers
        assert sql(pg, f"SELECT state FROM core_sandboxes WHERE id = '{sid2}'") == [["running"]]
        # a comes back (same data dir and network), adopts it, serves b again.
        a2 = daemon(pg, "rt-a", restart_of=a)
        a2.created |= a.created
        assert b.exec(sid2, "echo back")["stdout"] == "back\n"
        assert b.delete(sid2).status == 204
        a2.wait_no_leftovers(timeout=30, net=False)
        check_invariants(pg, [sid, sid2])
    finally:
        b.cleanup()
        (a2 or a).cleanup()
    no_net_leftovers(a, b)


def test_a_client_sent_forwarded_by_header_grants_nothing(pg):
    # Promise: X-Hatchery-Forwarded-By, sent by a client, grants nothing: without the key it is 401
    # on either host, and with the key it only stops a forward (the caller gets the local answer,
    # never an act on another host's sandbox). Fails if the header skips auth or reaches the owner.
    a = daemon(pg, "fb-a")
    b = daemon(pg, "fb-b")
    try:
        sid = a.create(ttl_seconds=300)
        exec_path = f"/v1/sandboxes/{sid}/exec"
        run = {"cmd": "touch /tmp/ran", "timeout_seconds": 10}
        for claimed in ("fb-a", "fb-b", "harness"):
            fwd = {"X-Hatchery-Forwarded-By": claimed}
            for d in (a, b):
                for creds in ({}, {"Authorization": "Bearer wrong-key"}, {"X-API-Key": "wrong-key"}):
                    h = {**fwd, **creds}
                    for method, path, body in [("GET", "/v1/sandboxes", None),
                                               ("GET", f"/v1/sandboxes/{sid}", None),
                                               ("POST", exec_path, run),
                                               ("DELETE", f"/v1/sandboxes/{sid}", None),
                                               ("POST", "/v1/sandboxes", {"ttl_seconds": 60})]:
                        r = d.request(method, path, body, auth=False, headers=h, timeout=30)
                        assert r.status == 401, (d.port, claimed, creds, method, path, r)
        # With the key: b, told it was forwarded to, answers from what it runs itself.
        fwd = {"X-Hatchery-Forwarded-By": "fb-a"}
        forwarded = forwards(b)
        r = b.request("POST", exec_path, run, headers=fwd, timeout=30)
        assert r.status == 409 and r.error_code() == "sandbox_not_running", r
        # b has nothing of it to stop (its delete is idempotent); a's sandbox stays.
        r = b.request("DELETE", f"/v1/sandboxes/{sid}", headers=fwd, timeout=30)
        assert r.status in (204, 404), r
        assert forwards(b) == forwarded
        # Nothing reached a's sandbox: it runs, and nothing ran in it.
        assert sql(pg, f"SELECT state FROM core_sandboxes WHERE id = '{sid}'") == [["running"]]
        assert a.exec(sid, "test -e /tmp/ran && echo ran || echo clean")["stdout"] == "clean\n"
        # The same key without the header is forwarded and acts, as the key allows.
        assert b.exec(sid, "echo via-b")["stdout"] == "via-b\n"
        assert forwards(b) == forwarded + 1
        assert b.delete(sid).status == 204
        assert sql(pg, f"SELECT state FROM core_sandboxes WHERE id = '{sid}'") == [["stopped"]]
        a.wait_no_leftovers(timeout=30, net=False)
    finally:
        b.cleanup()
        a.cleanup()
    no_net_leftovers(a, b)


def forwards(d):
    return metric(d, "hatchery_route_requests_total", 'outcome="forwarded"')


def test_control_places_creates_by_free_capacity(pg):
    h1 = daemon(pg, "pl-1", role="host", extra=["--max-sandboxes", "1"])
    h2 = daemon(pg, "pl-2", role="host", extra=["--max-sandboxes", "2"])
    c = daemon(pg, "pl-ctl", role="control")
    hosts = {"pl-1": h1, "pl-2": h2}
    try:
        # Both warm, so free room alone decides below.
        wait_warm(pg, hosts, "code-interpreter")
        assert c.request("GET", "/healthz", auth=False).json()["role"] == "control"
        assert c.request("GET", "/v1/sandboxes", auth=False).status == 401
        # Bad input is the host's answer, passed on as is; nothing is created.
        r = c.request("POST", "/v1/sandboxes", {"ttl_seconds": "soon"})
        assert r.status in (400, 422), r
        assert sql(pg, "SELECT count(*) FROM core_sandboxes WHERE host_id LIKE 'pl-%'") == [["0"]]
        # The control plane buffers at most 2 MiB of a create (it may send
        # it to more than one host): one byte more is 413 at once.
        cap = 2 << 20
        r = c.request("POST", "/v1/sandboxes", raw=b"{" + b" " * (cap - 1), headers={"Content-Type": "application/json"})
        assert 400 <= r.status < 500 and r.status != 413, r
        r = c.request("POST", "/v1/sandboxes", raw=b"{" + b" " * cap, headers={"Content-Type": "application/json"})
        assert r.status == 413 and r.error_code() == "too_large", r
        assert sql(pg, "SELECT count(*) FROM core_sandboxes WHERE host_id LIKE 'pl-%'") == [["0"]]
        sids = []
        for _ in range(3):
            r = c.request("POST", "/v1/sandboxes", {"ttl_seconds": 300, "metadata": {"suite": "hosts"}})
            assert r.status == 201, r
            sid = r.json()["id"]
            hosts[owner(pg, sid)].created.add(sid)
            sids.append(sid)
        placed = [owner(pg, s) for s in sids]
        # Most free first (pl-2: 2 free), then the tie by id (pl-1), then
        # pl-1 is full and skipped.
        assert placed == ["pl-2", "pl-1", "pl-2"], placed
        # None has room: 503 with Retry-After, and nothing half-created.
        before = sql(pg, "SELECT count(*) FROM core_sandboxes")
        r = c.request("POST", "/v1/sandboxes", {"ttl_seconds": 300})
        assert r.status == 503 and r.error_code() == "capacity", r
        assert "retry-after" in headers(r)
        assert sql(pg, "SELECT count(*) FROM core_sandboxes") == before
        # Everything through the control plane reaches the owner.
        for sid in sids:
            assert c.exec(sid, "echo ok")["stdout"] == "ok\n"
        assert c.put_file(sids[0], "/work/c.txt", b"via control").status == 204
        assert c.get_file(sids[0], "/work/c.txt").body == b"via control"
        r = c.request("GET", "/v1/sandboxes?metadata.suite=hosts")
        assert r.status == 200, r
        listed = {s["id"] for s in r.json()["sandboxes"]}
        assert listed == set(sids)
        assert c.request("GET", "/v1/sandboxes/sb-nope").status == 404
        check_invariants(pg, sids)
        # Deletes through control free the room again.
        assert c.delete(sids[1]).status == 204
        hosts["pl-1"].wait_no_leftovers(timeout=30, net=False)
        # Draining a host (docs/operations.md): capacity 0, so placement
        # skips it while what it runs stays up.
        sql(pg, "UPDATE core_hosts SET capacity = 0 WHERE id = 'pl-1'")
        r = c.request("POST", "/v1/sandboxes", {"ttl_seconds": 300})
        assert r.status == 503 and r.error_code() == "capacity", r
        sql(pg, "UPDATE core_hosts SET capacity = 1 WHERE id = 'pl-1'")
        r = c.request("POST", "/v1/sandboxes", {"ttl_seconds": 300})
        assert r.status == 201, r
        assert owner(pg, r.json()["id"]) == "pl-1"
        h1.created.add(r.json()["id"])
    finally:
        c.cleanup()
        h2.cleanup()
        h1.cleanup()
    no_net_leftovers(h1, h2)


def test_control_prefers_a_warm_checkpoint_and_spreads_a_tenant(pg):
    """Placement: a host with the template's checkpoint before more free
    room; among those, the fewest of the tenant's sandboxes; then room."""
    tdir = support.private_templates()
    support.seed_rootfs(tdir, "warm-two")
    # Both hosts share one templates dir, as hosts mounting it would.
    a = daemon(pg, "pw-a", role="host", extra=["--max-sandboxes", "2"], templates_dir=tdir)
    b = daemon(pg, "pw-b", role="host", extra=["--max-sandboxes", "5"], templates_dir=tdir)
    c = daemon(pg, "pw-ctl", role="control")
    hosts = {"pw-a": a, "pw-b": b}

    def create(**body):
        r = c.request("POST", "/v1/sandboxes", {"ttl_seconds": 300, **body})
        assert r.status == 201, r
        sid = r.json()["id"]
        hosts[owner(pg, sid)].created.add(sid)
        return sid

    try:
        wait_warm(pg, hosts, "code-interpreter")
        # One tenant is spread before free room counts: by room alone all
        # three would go to pw-b (5 free against 2).
        acme = [create(metadata={"tenant": "acme"}) for _ in range(3)]
        assert [owner(pg, s) for s in acme] == ["pw-b", "pw-a", "pw-b"]
        # Without a tenant: the most free room (pw-b: 3 free, pw-a: 1).
        plain = create()
        assert owner(pg, plain) == "pw-b"
        for sid in acme + [plain]:
            assert c.delete(sid).status == 204
        a.wait_no_leftovers(timeout=30, net=False)
        b.wait_no_leftovers(timeout=30, net=False)
        # A template only pw-a has baked (built there; pw-b sees the
        # template in the shared dir but has no checkpoint of it).
        r = a.request("POST", "/v1/templates", {"name": "warm-two", "files": {"/opt/w.txt": "warm\n"}})
        assert r.status == 202, r
        wait_warm(pg, ["pw-a"], "warm-two")
        assert "warm-two" not in warm(pg, "pw-b")
        two = [create(template="warm-two") for _ in range(2)]
        assert [owner(pg, s) for s in two] == ["pw-a", "pw-a"], "the warm host first, despite less room"
        # The warm host is full: the next one boots cold on the other.
        t0 = time.time()
        cold = create(template="warm-two")
        cold_s = time.time() - t0
        assert owner(pg, cold) == "pw-b"
        for sid in two + [cold]:
            assert c.exec(sid, "cat /opt/w.txt")["stdout"] == "warm\n"
        check_invariants(pg, two + [cold])
        print(f"cold create on the host without the checkpoint: {cold_s:.2f}s")
    finally:
        c.cleanup()
        b.cleanup()
        a.cleanup()
        shutil.rmtree(tdir, ignore_errors=True)
    no_net_leftovers(a, b)


def test_e2b_and_preview_requests_reach_the_owning_host(pg):
    """E2B's control plane (X-API-Key), E2B's sandbox traffic
    (E2b-Sandbox-Id + X-Access-Token) and preview URLs (the token is the
    credential) name their sandbox elsewhere than /v1/sandboxes/{id}: sent
    to a host that does not own it, or to the control plane, they reach
    the owner."""
    a = daemon(pg, "ep-a")
    b = daemon(pg, "ep-b")
    c = daemon(pg, "ep-ctl", role="control")
    e2b_key = {"X-API-Key": KEY}
    try:
        # An E2B create through the control plane is placed like any.
        r = c.request("POST", "/e2b/sandboxes", {"templateID": "code-interpreter", "timeout": 300},
                      auth=False, headers=e2b_key)
        assert r.status == 201, r
        e2b = r.json()
        sid, token = e2b["sandboxID"], e2b["envdAccessToken"]
        own = owner(pg, sid)
        other = {"ep-a": b, "ep-b": a}[own]
        {"ep-a": a, "ep-b": b}[own].created.add(sid)
        assert c.put_file(sid, "/work/e.txt", b"from the owner").status == 204
        for via in (other, c):
            r = via.request("GET", f"/e2b/sandboxes/{sid}", auth=False, headers=e2b_key)
            assert r.status == 200 and r.json()["sandboxID"] == sid, r
            r = via.request("GET", "/e2b/sandbox/files?path=/work/e.txt", auth=False,
                            headers={"E2b-Sandbox-Id": sid, "X-Access-Token": token})
            assert r.status == 200 and r.body == b"from the owner", r
            # A wrong token is refused by the owner, who alone can check it.
            r = via.request("GET", "/e2b/sandbox/files?path=/work/e.txt", auth=False,
                            headers={"E2b-Sandbox-Id": sid, "X-Access-Token": "00" * 24})
            assert r.status == 401, r
        # A preview URL minted by the owner works on any host.
        start_guest_server(c, sid, "echo", HTTP_ECHO, 8000)
        r = c.request("POST", f"/v1/sandboxes/{sid}/ports/8000/preview-url", {})
        assert r.status == 200, r
        path = r.json()["path"]
        for via in (other, c):
            # On each daemon's preview listener, forwarded to the owner with
            # the daemon key, which the guest never sees.
            r = via.preview("GET", path + "hello?x=1")
            assert r.status == 200 and r.json()["path"] == "/hello?x=1", r
            seen = {k.lower() for k, _ in r.json()["headers"]}
            assert "x-hatchery-daemon-key" not in seen, seen
            # Never on an API listener: sent to that daemon's preview origin.
            r = via.request("GET", path + "hello", auth=False)
            assert r.status == 308 and r.headers["location"] == f"http://{via.addr}:{via.preview_port}{path}hello", r
            # E2B's relayed ports the same: the preview listener relays them
            # (from the owner), the API's refuses them.
            e2b_port = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "8000", "X-Access-Token": token}
            r = via.preview("GET", "/e2b/sandbox/hi", headers=e2b_port)
            assert r.status == 200 and r.json()["path"] == "/hi", r
            r = via.request("GET", "/e2b/sandbox/hi", auth=False, headers=e2b_port)
            assert r.status == 421 and "preview origin" in r.json()["message"], r
        r = other.preview("GET", path[:-3] + ("A" if path[-3] != "A" else "B") + path[-2:])
        assert r.status in (403, 404), r
        # A client cannot pass as a forwarding daemon.
        r = c.request("GET", path + "hello", auth=False, headers={"X-Hatchery-Daemon-Key": "hxd_" + "0" * 64})
        assert r.status == 308, r
        m = other.request("GET", "/metrics").body.decode()
        assert 'hatchery_route_requests_total{outcome="forwarded"}' in m

        # Paused and resumed, the E2B id keeps working from anywhere: the
        # pause is a snapshot that names it, the resumed sandbox (another
        # Hatchery id) carries it in its metadata, and routing reads both.
        r = c.request("POST", f"/e2b/sandboxes/{sid}/pause", {}, auth=False, headers=e2b_key)
        assert r.status == 204, r
        for via in (other, c):
            r = via.request("GET", f"/e2b/sandboxes/{sid}", auth=False, headers=e2b_key)
            assert r.status == 200 and r.json()["state"] == "paused", r
            assert r.json()["metadata"] == {}, r  # the adapter's keys are not shown
            r = via.request("GET", "/e2b/v2/sandboxes?state=paused", auth=False, headers=e2b_key)
            assert [x["sandboxID"] for x in r.json()].count(sid) == 1, r
        r = other.request("POST", f"/e2b/sandboxes/{sid}/connect", {"timeout": 300}, auth=False, headers=e2b_key)
        assert r.status == 201 and r.json()["sandboxID"] == sid, r
        rows = sql(pg, "SELECT id, host_id FROM core_sandboxes WHERE state = 'running' "
                       f"AND metadata->>'e2b_sandbox_id' = '{sid}'")
        assert len(rows) == 1 and rows[0][0] != sid, rows
        resumed, resumed_on = rows[0]
        {"ep-a": a, "ep-b": b}[resumed_on].created.add(resumed)
        assert sql(pg, f"SELECT count(*) FROM core_snapshots WHERE metadata->>'e2b_paused_sandbox' = '{sid}'") == [["0"]]
        for via in (a, b, c):
            r = via.request("GET", "/e2b/sandbox/files?path=/work/e.txt", auth=False,
                            headers={"E2b-Sandbox-Id": sid, "X-Access-Token": token})
            assert r.status == 200 and r.body == b"from the owner", (via.port, r)
            r = via.request("GET", f"/e2b/sandboxes/{sid}", auth=False, headers=e2b_key)
            assert r.status == 200 and r.json()["state"] == "running" and r.json()["metadata"] == {}, r
        r = c.request("GET", "/e2b/v2/sandboxes", auth=False, headers=e2b_key)
        assert [x["sandboxID"] for x in r.json()] == [sid], r
        r = other.request("DELETE", f"/e2b/sandboxes/{sid}", auth=False, headers=e2b_key)
        assert r.status == 204, r
        assert sql(pg, f"SELECT state FROM core_sandboxes WHERE id IN ('{sid}', '{resumed}')") == [["stopped"], ["stopped"]]
        r = c.request("GET", f"/e2b/sandboxes/{sid}", auth=False, headers=e2b_key)
        assert r.status == 404, r
        check_invariants(pg, [sid, resumed])
    finally:
        c.cleanup()
        b.cleanup()
        a.cleanup()
    no_net_leftovers(a, b)


def test_sigkilled_host_is_marked_lost_and_not_resurrected(pg):
    """One control plane (and a second one at once) and three hosts, each
    host in a network namespace of its own."""
    h1 = daemon(pg, "kl-1", role="host")
    h2 = daemon(pg, "kl-2", role="host")
    h3 = daemon(pg, "kl-3", role="host")
    c = daemon(pg, "kl-ctl", role="control")
    # Two control processes at once: both sweep, each lost row is stopped once.
    c2 = daemon(pg, "kl-ctl2", role="control")
    h1b = None
    try:
        lost = [h1.create(ttl_seconds=600) for _ in range(2)]
        kept = h2.create(ttl_seconds=600)
        kept3 = h3.create(ttl_seconds=600)
        e0 = epoch(pg, "kl-1")
        survivors = {h: epoch(pg, h) for h in ("kl-2", "kl-3")}
        h1.crash()
        killed = time.time()
        # Until it is marked, control answers 503 for its sandboxes.
        r = c.request("POST", f"/v1/sandboxes/{lost[0]}/exec", {"cmd": "true"}, timeout=30)
        assert r.status == 503 and r.error_code() in ("host_unreachable", "host_lost"), r
        wait_for(lambda: sql(pg, f"SELECT count(*) FROM core_sandboxes WHERE host_id = 'kl-1' AND state = 'stopped' "
                                 f"AND end_reason = 'host_lost'") == [["2"]], timeout=LOSS_WAIT, what="host marked lost")
        marked_after = time.time() - killed
        for sid in lost:
            kinds = [k for (k,) in sql(pg, f"SELECT kind FROM core_events WHERE sandbox_id = '{sid}' ORDER BY seq")]
            assert kinds.count("stopped") == 1 and kinds[-1] == "stopped", kinds
        # Lost, and said so: 410 sandbox_lost, not an unknown sandbox.
        r = c2.request("GET", f"/v1/sandboxes/{lost[1]}")
        assert (r.status, r.error_code()) == (410, "sandbox_lost"), r
        assert marked_after < LOSS_WAIT
        r = c.request("GET", f"/v1/sandboxes/{lost[0]}")
        assert (r.status, r.json()["error"]["host"]) == (410, "kl-1"), r
        # Creates go to the hosts that are left, which lost nothing.
        for _ in range(2):
            r = c.request("POST", "/v1/sandboxes", {"ttl_seconds": 300})
            assert r.status == 201, r
            {"kl-2": h2, "kl-3": h3}[owner(pg, r.json()["id"])].created.add(r.json()["id"])
        assert c.exec(kept, "echo alive")["stdout"] == "alive\n"
        assert c.exec(kept3, "echo alive")["stdout"] == "alive\n"
        assert {h: epoch(pg, h) for h in survivors} == survivors
        # The sweep took the lease (epoch grew); the host's restart takes
        # it again, destroys what its shims still ran, and resurrects none.
        e1 = epoch(pg, "kl-1")
        assert e1 > e0
        h1b = daemon(pg, "kl-1", role="host", restart_of=h1)
        h1b.created |= h1.created
        assert epoch(pg, "kl-1") > e1
        h1b.wait_no_leftovers(timeout=30, net=False)
        assert sql(pg, f"SELECT state FROM core_sandboxes WHERE id IN ('{lost[0]}', '{lost[1]}')") == [["stopped"]] * 2
        check_invariants(pg, [*lost, kept, kept3])
        print(f"host marked lost {marked_after:.1f}s after SIGKILL")
    finally:
        c2.cleanup()
        c.cleanup()
        h3.cleanup()
        h2.cleanup()
        (h1b or h1).cleanup()
    no_net_leftovers(h1, h2, h3)


def test_paused_host_is_fenced_and_kills_its_sandboxes(pg):
    """No control plane here: the other host marks the paused one lost."""
    h1 = daemon(pg, "st-1", role="host")
    h2 = daemon(pg, "st-2", role="host")
    try:
        sid = h1.create(ttl_seconds=600)
        # A tenant's sandbox too: lost, it is named (and its host) to its
        # tenant and the operator only; another tenant's key gets the 404
        # of a missing one (issue 36).
        keys = {}
        for name in ("st-owner", "st-other"):
            tid = h2.request("POST", "/v1/tenants", {"name": name, "limits": {}}).json()["id"]
            r = h2.request("POST", f"/v1/tenants/{tid}/keys")
            assert r.status == 201, r
            keys[name] = {"Authorization": "Bearer " + r.json()["key"]}
        r = h1.request("POST", "/v1/sandboxes", {"ttl_seconds": 600}, auth=False, headers=keys["st-owner"])
        assert r.status == 201, r
        tsid = r.json()["id"]
        h1.created.add(tsid)
        e0 = epoch(pg, "st-1")
        h1.proc.send_signal(signal.SIGSTOP)
        try:
            wait_for(lambda: sql(pg, f"SELECT state, end_reason FROM core_sandboxes WHERE id = '{sid}'")
                     == [["stopped", "host_lost"]], timeout=LOSS_WAIT, what="paused host marked lost")
            # While it sleeps, its sandbox is lost for everyone else, and
            # says so.
            r = h2.request("GET", f"/v1/sandboxes/{sid}")
            assert (r.status, r.error_code()) == (410, "sandbox_lost"), r
            wait_for(lambda: sql(pg, f"SELECT state FROM core_sandboxes WHERE id = '{tsid}'") == [["stopped"]],
                     timeout=LOSS_WAIT, what="the tenant's sandbox marked lost")
            r = h2.request("GET", f"/v1/sandboxes/{tsid}", auth=False, headers=keys["st-owner"])
            assert (r.status, r.error_code(), r.json()["error"]["host"]) == (410, "sandbox_lost", "st-1"), r
            for path in (f"/v1/sandboxes/{tsid}", f"/v1/sandboxes/{tsid}/exec"):
                r = h2.request("POST" if path.endswith("exec") else "GET", path,
                               {"cmd": "true"} if path.endswith("exec") else None,
                               auth=False, headers=keys["st-other"])
                assert (r.status, r.error_code()) == (404, "sandbox_not_found"), (path, r)
                assert "st-1" not in r.body.decode(), r
        finally:
            h1.proc.send_signal(signal.SIGCONT)
        assert epoch(pg, "st-1") > e0
        assert "host lost: its sandboxes marked stopped" in open(h2.log_path, errors="replace").read()
        # Awake, it finds its lease gone, kills its sandboxes and refuses
        # work; its late writes are refused (no event after the stop).
        wait_for(lambda: "lease taken over" in open(h1.log_path, errors="replace").read(),
                 timeout=40, what="paused host noticing it was fenced")
        h1.wait_no_leftovers(timeout=30, net=False)
        r = h1.request("POST", "/v1/sandboxes", {"ttl_seconds": 60})
        assert r.status == 503 and r.error_code() == "store_unavailable", r
        evs = sql(pg, f"SELECT kind, epoch FROM core_events WHERE sandbox_id = '{sid}' ORDER BY seq")
        kinds = [k for k, _ in evs]
        assert kinds[-1] == "stopped" and kinds.count("stopped") == 1, evs
        assert sql(pg, f"SELECT state FROM core_sandboxes WHERE id = '{sid}'") == [["stopped"]]
        assert h2.exec(h2.create(ttl_seconds=60), "echo ok")["stdout"] == "ok\n"
        check_invariants(pg, [sid, tsid])
    finally:
        h2.cleanup()
        h1.cleanup()
    no_net_leftovers(h1, h2)


def test_e2b_tenant_keys_hold_across_hosts(pg):
    """Issue 36: a tenant's key on E2B's protocol, on many hosts. Tenants
    and keys are in the shared database, so a key made through one host
    works through the control plane and every host: its create is placed
    on a host and records its tenant (whatever metadata it sends); through
    any daemon the key sees and acts on its own sandbox, and another
    tenant's key gets E2B's 404 for it, in lists too."""
    a = daemon(pg, "tk-a")
    b = daemon(pg, "tk-b")
    c = daemon(pg, "tk-ctl", role="control")

    def tenant(name):
        r = a.request("POST", "/v1/tenants", {"name": name, "limits": {}})
        assert r.status == 201, r
        tid = r.json()["id"]
        r = a.request("POST", f"/v1/tenants/{tid}/keys")
        assert r.status == 201, r
        return tid, {"X-API-Key": r.json()["key"]}

    try:
        ta, ka = tenant("tk-one")
        tb, kb = tenant("tk-two")
        r = c.request("POST", "/e2b/sandboxes", {"templateID": "code-interpreter", "timeout": 300,
                                                 "metadata": {"tenant": tb}}, auth=False, headers=ka)
        assert r.status == 201, r
        sid = r.json()["sandboxID"]
        own = owner(pg, sid)
        {"tk-a": a, "tk-b": b}[own].created.add(sid)
        assert sql(pg, f"SELECT metadata->>'tenant' FROM core_sandboxes WHERE id = '{sid}'") == [[ta]]
        for via in (a, b, c):
            r = via.request("GET", f"/e2b/sandboxes/{sid}", auth=False, headers=ka)
            assert r.status == 200 and r.json()["sandboxID"] == sid, (via.port, r)
            r = via.request("GET", f"/e2b/sandboxes/{sid}", auth=False, headers=kb)
            assert r.status == 404, (via.port, r)
            r = via.request("GET", "/e2b/v2/sandboxes", auth=False, headers=kb)
            assert r.status == 200 and sid not in [x["sandboxID"] for x in r.json()], (via.port, r)
            r = via.request("GET", "/e2b/v2/sandboxes", auth=False, headers=ka)
            assert r.status == 200 and [x["sandboxID"] for x in r.json()] == [sid], (via.port, r)
        # Acting on it: the other tenant's delete is a 404 and changes
        # nothing; its own goes through from a host that does not own it.
        other = {"tk-a": b, "tk-b": a}[own]
        r = c.request("DELETE", f"/e2b/sandboxes/{sid}", auth=False, headers=kb)
        assert r.status == 404, r
        assert sql(pg, f"SELECT state FROM core_sandboxes WHERE id = '{sid}'") == [["running"]]
        r = other.request("DELETE", f"/e2b/sandboxes/{sid}", auth=False, headers=ka)
        assert r.status == 204, r
        assert sql(pg, f"SELECT state FROM core_sandboxes WHERE id = '{sid}'") == [["stopped"]]
        # A revoked key is refused by the daemon that revoked it at once
        # (its cache is emptied on revoke).
        kid = a.request("GET", f"/v1/tenants/{ta}/keys").json()["keys"][0]["id"]
        r = a.request("DELETE", f"/v1/tenants/{ta}/keys/{kid}")
        assert r.status == 200 and r.json()["revoked_at"], r
        r = a.request("POST", "/e2b/sandboxes", {"templateID": "code-interpreter"}, auth=False, headers=ka)
        assert r.status == 401, r
        # The others within their cache's 5 s (hatchery-tenants CACHE_TTL).
        for via in (b, c):
            wait_for(lambda: via.request("GET", "/e2b/v2/sandboxes", auth=False, headers=ka).status == 401,
                     timeout=10, what="the revoked key refused")
    finally:
        c.cleanup()
        b.cleanup()
        a.cleanup()
    no_net_leftovers(a, b)
