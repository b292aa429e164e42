"""Egress policy against a fake internet built in a test netns (netlab):
default deny, allow rules, always-blocked ranges, runtime changes that cut
open connections, host pinning, sandbox-to-sandbox isolation, events, and
no leaked slot after deletes or a crash."""

import errno
import json
import os
import socket
import subprocess
import tempfile
import threading
import time

import pytest

from harness import Daemon, metric, wait_baked, wait_for
from netlab import METADATA, PRIVATE, PROBE, PUBLIC, PUBLIC2, NetLab


@pytest.fixture(scope="module")
def lab():
    n = NetLab().up()
    yield n
    n.down()


@pytest.fixture
def netd(lab):
    hosts = tempfile.NamedTemporaryFile("w", prefix="hx-hosts-", suffix=".txt", delete=False)
    hosts.write(f"{PUBLIC} pypi.example\n")
    hosts.close()
    d = Daemon(extra_args=["--pool-size", "0", "--net-hosts-file", hosts.name]).start()
    # The bake holds a slot while it runs; tests count slots from a rest.
    wait_baked(d)
    yield d
    d.cleanup()
    os.unlink(hosts.name)


def new(d, network=None, **kw):
    if network is not None:
        kw["network"] = network
    sid = d.create(**kw)
    assert d.put_file(sid, "/tmp/probe.py", PROBE.encode()).status == 204
    return sid


def probe(d, sid, *specs, expect=None):
    """The probes' results. With `expect` (the specs that should open), a
    probe that did not open is tried twice more: under both lanes of
    `make test`, the first connection out of a sandbox just snapshotted or
    forked has timed out (3 s) in CI (2 of the last 3 runs, cause not found;
    docs/testing.md), and a retry still fails if the policy never opens."""
    for attempt in range(3):
        r = d.exec(sid, argv=["python3", "/tmp/probe.py", *specs], timeout_seconds=60)
        assert r["exit_code"] == 0, r
        results = json.loads(r["stdout"])
        if expect is None or opened(results) == expect or attempt == 2:
            return results


def opened(results):
    return {k for k, v in results.items() if v.startswith("open")}


EVERYWHERE = [f"{kind},{h},{p}" for h in (PUBLIC, METADATA, PRIVATE)
              for kind, p in (("tcp", 80), ("udp", 9999), ("icmp", 0))]


def test_lab_is_reachable_from_the_host(lab):
    # Otherwise every "blocked" below would prove nothing.
    for h in (PUBLIC, METADATA, PRIVATE):
        s = socket.create_connection((h, 80), timeout=3)
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        assert b"hello from " + h.encode() in s.recv(200)
        s.close()


def test_default_deny_blocks_everything(netd):
    sid = new(netd)
    gw = gateway(netd, sid)
    res = probe(netd, sid, *EVERYWHERE, f"tcp,{gw},{netd.port}", f"tcp,{gw},22", "tcp6,2001:db8::1,80")
    assert opened(res) == set(), res
    # The lab has no IPv6, so a v6 connect could not succeed anyway: what
    # this shows is that the sandbox has no IPv6 path at all (unreachable at
    # once, not a drop that times out), so nothing v6 can leave it.
    v6 = res["tcp6,2001:db8::1,80"]
    assert v6 in (f"blocked:OSError:{errno.ENETUNREACH}", f"blocked:OSError:{errno.EHOSTUNREACH}"), res
    # (The sandbox's own 127.0.0.1 is its own netstack's loopback, never the
    # host's: the host's side is the gateway probed above.)
    assert netd.request("GET", f"/v1/sandboxes/{sid}/network").json() == {"egress": "deny", "allow": [], "deny": []}


def gateway(d, sid):
    r = d.exec(sid, "awk 'NR>1 && $2==\"00000000\" {print $3}' /proc/net/route")
    hexgw = r["stdout"].strip()
    return socket.inet_ntoa(bytes.fromhex(hexgw)[::-1])


def test_allow_rule_opens_exactly_that_destination_and_port(netd):
    sid = new(netd, {"allow": [{"cidr": f"{PUBLIC}/32", "ports": [80]}]})
    res = probe(netd, sid, f"tcp,{PUBLIC},80", f"tcp,{PUBLIC},8080", f"tcp,{PUBLIC2},80",
                f"udp,{PUBLIC},9999", f"icmp,{PUBLIC},0")
    assert opened(res) == {f"tcp,{PUBLIC},80"}, res
    assert f"hello from {PUBLIC}:80" in res[f"tcp,{PUBLIC},80"]
    # A rule without ports opens every protocol to that address.
    r = netd.request("PUT", f"/v1/sandboxes/{sid}/network", {"allow": [{"cidr": PUBLIC}]})
    assert r.status == 200, r
    res = probe(netd, sid, f"tcp,{PUBLIC},8080", f"udp,{PUBLIC},9999", f"icmp,{PUBLIC},0", f"tcp,{PUBLIC2},80")
    assert opened(res) == {f"tcp,{PUBLIC},8080", f"udp,{PUBLIC},9999", f"icmp,{PUBLIC},0"}, res


def test_always_blocked_ranges_survive_egress_allow(netd):
    policy = {"egress": "allow", "allow": [{"cidr": f"{METADATA}/32"}, {"cidr": "10.0.0.0/8", "ports": [80]}]}
    sid = new(netd, policy)
    gw = gateway(netd, sid)
    res = probe(netd, sid, f"tcp,{PUBLIC},80", f"tcp,{PUBLIC2},8080", f"udp,{PUBLIC},9999",
                f"tcp,{METADATA},80", f"udp,{METADATA},9999", f"icmp,{METADATA},0",
                f"tcp,{PRIVATE},80", f"icmp,{PRIVATE},0", f"tcp,{gw},{netd.port}")
    assert opened(res) == {f"tcp,{PUBLIC},80", f"tcp,{PUBLIC2},8080", f"udp,{PUBLIC},9999"}, res
    # Another sandbox, with a server actually listening: test_sandboxes_cannot_reach_each_other.


def test_deny_beats_allow(netd):
    sid = new(netd, {"egress": "allow", "deny": [{"cidr": PUBLIC2}, {"cidr": PUBLIC, "ports": [8080]}]})
    res = probe(netd, sid, f"tcp,{PUBLIC},80", f"tcp,{PUBLIC},8080", f"tcp,{PUBLIC2},80")
    assert opened(res) == {f"tcp,{PUBLIC},80"}, res


def guest_ip(d, sid):
    r = d.exec(sid, "python3 -c \"import socket; s=socket.socket(2,2); s.connect(('198.51.100.7',9)); print(s.getsockname()[0])\"")
    return r["stdout"].strip()


def test_sandboxes_cannot_reach_each_other(netd):
    a = new(netd, {"egress": "allow"})
    b = new(netd, {"egress": "allow"})
    a_ip, b_ip = guest_ip(netd, a), guest_ip(netd, b)
    assert a_ip != b_ip
    # A serves; B (whose egress is open) tries it, and so does the host.
    serve = ("import socket, time\n"
             "s = socket.socket(); s.setsockopt(1, 2, 1); s.bind(('0.0.0.0', 8000)); s.listen(); s.settimeout(1)\n"
             "u = socket.socket(2, 2); u.bind(('0.0.0.0', 8000)); u.settimeout(0.1)\n"
             "end = time.time() + 10\n"
             "while time.time() < end:\n"
             "    try: c, _ = s.accept(); c.sendall(b'HTTP/1.0 200 OK\\r\\n\\r\\nA'); c.close()\n"
             "    except OSError: pass\n"
             "    try: d, a = u.recvfrom(100); u.sendto(b'udp-ok', a)\n"
             "    except OSError: pass\n")
    netd.put_file(a, "/tmp/serve.py", serve.encode())
    server = threading.Thread(target=netd.exec, args=(a, "python3 /tmp/serve.py"), kwargs={"timeout_seconds": 20})
    server.start()
    wait_for(lambda: "open" in probe(netd, a, f"tcp,{a_ip},8000")[f"tcp,{a_ip},8000"], timeout=8,
             what="server up inside A")
    # Both of A's servers answer (so B's "blocked" below is the policy).
    assert opened(probe(netd, a, f"tcp,{a_ip},8000", f"udp,{a_ip},8000", expect={f"tcp,{a_ip},8000", f"udp,{a_ip},8000"})) == {f"tcp,{a_ip},8000", f"udp,{a_ip},8000"}
    res = probe(netd, b, f"tcp,{a_ip},8000", f"icmp,{a_ip},0", f"udp,{a_ip},8000")
    assert opened(res) == set(), res
    server.join()


def test_closing_a_hole_cuts_new_and_open_connections(netd):
    sid = new(netd, {"allow": [{"cidr": PUBLIC, "ports": [7, 80]}]})
    # Holds an echo connection open and reports each round trip; then a
    # new connection after the policy changes.
    script = r'''
import socket, sys, time
s = socket.create_connection(("198.51.100.7", 7), timeout=3)
s.sendall(b"one"); print("first", s.recv(10).decode(), flush=True)
open("/tmp/connected", "w").close()
while not __import__("os").path.exists("/tmp/closed"): time.sleep(0.01)
try:
    s.sendall(b"two"); d = s.recv(10); print("second", d.decode() or "EOF", flush=True)
except Exception as e:
    print("second", type(e).__name__, flush=True)
try:
    socket.create_connection(("198.51.100.7", 80), timeout=3); print("new open")
except Exception as e:
    print("new", type(e).__name__)
'''
    netd.put_file(sid, "/tmp/hold.py", script.encode())
    out = {}
    t = threading.Thread(target=lambda: out.update(netd.exec(sid, "python3 /tmp/hold.py", timeout_seconds=30)))
    t.start()
    wait_for(lambda: netd.request("GET", f"/v1/sandboxes/{sid}/files?path=/tmp/connected").status == 200,
             timeout=20, what="connection up")
    r = netd.request("PUT", f"/v1/sandboxes/{sid}/network", {"egress": "deny"})
    assert r.status == 200 and r.json()["allow"] == []
    netd.put_file(sid, "/tmp/closed", b"")
    t.join()
    lines = out["stdout"].splitlines()
    assert lines[0] == "first one", out
    assert lines[1] in ("second ConnectionResetError", "second EOF", "second TimeoutError", "second BrokenPipeError"), out
    assert lines[2].startswith("new ") and lines[2] != "new open", out


def test_opening_a_hole_applies_within_100ms(netd):
    sid = new(netd)
    # In-guest loop: timestamp of the first successful connect.
    script = r'''
import socket, time
open("/tmp/looping", "w").close()
end = time.time() + 15
while time.time() < end:
    s = socket.socket(); s.settimeout(0.5)
    try:
        s.connect(("198.51.100.7", 80)); print(repr(time.time())); break
    except OSError:
        time.sleep(0.005)
    finally:
        s.close()
'''
    netd.put_file(sid, "/tmp/loop.py", script.encode())
    out = {}
    t = threading.Thread(target=lambda: out.update(netd.exec(sid, "python3 /tmp/loop.py", timeout_seconds=30)))
    t.start()
    wait_for(lambda: netd.request("GET", f"/v1/sandboxes/{sid}/files?path=/tmp/looping").status == 200,
             timeout=20, what="loop running")
    time.sleep(0.3)
    r = netd.request("PUT", f"/v1/sandboxes/{sid}/network", {"allow": [{"cidr": PUBLIC, "ports": [80]}]})
    returned = time.time()
    assert r.status == 200
    t.join()
    first_ok = float(out["stdout"].strip())
    # The guest clock is the host clock (gVisor reads the host's vDSO time).
    assert first_ok - returned < 0.1, (first_ok - returned, out)


def test_host_rules_are_pinned_on_the_host(netd):
    sid = new(netd, {"allow": [{"host": "pypi.example", "ports": [80]}]})
    # The pinned address is in the guest's /etc/hosts, so the name works.
    r = netd.exec(sid, "python3 -c \"import socket; print(socket.gethostbyname('pypi.example'))\"")
    assert r["stdout"].strip() == PUBLIC, r
    assert opened(probe(netd, sid, "tcp,pypi.example,80", expect={"tcp,pypi.example,80"})) == {"tcp,pypi.example,80"}
    # By name via the guest's own /etc/hosts pointing elsewhere: still only
    # the address the host resolved is open.
    netd.exec(sid, f"echo '{PUBLIC2} pypi.example' > /etc/hosts")
    res = probe(netd, sid, f"tcp,{PUBLIC},80", f"tcp,{PUBLIC2},80", "tcp,pypi.example,80", f"tcp,{PUBLIC},8080")
    assert opened(res) == {f"tcp,{PUBLIC},80"}, res
    r = netd.request("PUT", f"/v1/sandboxes/{sid}/network", {"allow": [{"host": "nosuchhost.invalid"}]})
    assert r.status == 400 and r.error_code() == "invalid_network_policy", r
    assert netd.request("GET", f"/v1/sandboxes/{sid}/network").json()["allow"][0]["host"] == "pypi.example"


def test_denied_attempts_become_events_and_metrics(netd):
    sid = new(netd, {"allow": [{"cidr": PUBLIC, "ports": [80]}]})
    before = metric(netd, "hatchery_egress_denied_total")
    probe(netd, sid, f"tcp,{METADATA},80", f"udp,{PUBLIC2},9999", f"tcp,{PUBLIC},80")
    wait_for(lambda: len(netd.request("GET", f"/v1/sandboxes/{sid}/network/events").json()["events"]) >= 2,
             timeout=10, what="events")
    events = netd.request("GET", f"/v1/sandboxes/{sid}/network/events").json()["events"]
    got = {(e["protocol"], e["destination"], e["port"]) for e in events}
    assert ("tcp", METADATA, 80) in got and ("udp", PUBLIC2, 9999) in got, events
    assert all(e["destination"] != PUBLIC or e["port"] != 80 for e in events), "allowed traffic is no event"
    assert all(e["time"].endswith("Z") for e in events)
    # Numbered 1, 2, ... per sandbox, in order, none missing.
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1)), events
    assert metric(netd, "hatchery_egress_denied_total") >= before + 2
    # A flood is rate-limited, not a log storm.
    flood = "python3 -c \"import socket\nfor i in range(3000):\n  s=socket.socket(2,2); s.sendto(b'x',('198.51.100.8',10000+i%500))\""
    netd.exec(sid, flood, timeout_seconds=60)
    time.sleep(1)
    n = metric(netd, "hatchery_egress_denied_total") - before
    assert n < 400, n


def test_bad_policies_are_400_and_create_nothing(netd):
    leased = metric(netd, "hatchery_net_slots_leased")
    live = metric(netd, "hatchery_sandboxes_live")
    bad = [
        {"egress": "maybe"},
        {"allow": [{"cidr": "203.0.113.0/33"}]},
        {"allow": [{"cidr": "2001:db8::/32"}]},
        {"allow": [{"host": "a.example", "cidr": "1.2.3.4"}]},
        {"allow": [{}]},
        {"allow": [{"cidr": "1.2.3.4", "ports": [70000]}]},
        {"allow": [{"cidr": "1.2.3.4", "ports": [0]}]},
        {"allow": [{"cidr": "1.2.3.4", "ports": list(range(1, 18))}]},
        {"allow": [{"cidr": "1.2.3.4"}] * 65},
        {"allow": [{"host": "nosuchhost.invalid"}]},
        {"allow": [{"host": "bad_name"}]},
        {"egress": "deny", "extra": 1},
        "deny",
    ]
    for p in bad:
        r = netd.request("POST", "/v1/sandboxes", {"network": p})
        assert r.status == 400, (p, r)
        assert r.json()["error"]["code"] in ("invalid_network_policy", "invalid_request", "invalid_json"), r
    at_cap = {"deny": [{"cidr": "1.2.3.4", "ports": list(range(1, 17))}] * 64}
    sid = netd.create(network=at_cap)
    assert len(netd.request("GET", f"/v1/sandboxes/{sid}/network").json()["deny"]) == 64
    netd.delete(sid)
    wait_for(lambda: metric(netd, "hatchery_net_slots_leased") == leased, timeout=20, what="slot back")
    assert metric(netd, "hatchery_sandboxes_live") == live
    assert netd.request("PUT", "/v1/sandboxes/sbx_0000000000000000/network", {}).status == 404


def test_forks_get_their_own_slot_and_policy(netd):
    src = new(netd, {"allow": [{"cidr": PUBLIC, "ports": [80]}]})
    snap = netd.request("POST", f"/v1/sandboxes/{src}/snapshots", {}).json()["id"]
    r = netd.request("POST", f"/v1/snapshots/{snap}/fork", {"count": 2})
    assert r.status == 201, r
    f1, f2 = [s["id"] for s in r.json()["sandboxes"]]
    netd.created |= {f1, f2}
    r = netd.request("POST", f"/v1/snapshots/{snap}/fork", {"network": {"allow": [{"cidr": PUBLIC, "ports": [8080]}]}})
    f3 = r.json()["sandboxes"][0]["id"]
    netd.created.add(f3)
    ips = {guest_ip(netd, s) for s in (src, f1, f2, f3)}
    assert len(ips) == 4, ips
    assert opened(probe(netd, src, f"tcp,{PUBLIC},80", expect={f"tcp,{PUBLIC},80"})) == {f"tcp,{PUBLIC},80"}
    # Forks do not inherit the source's holes.
    assert opened(probe(netd, f1, f"tcp,{PUBLIC},80")) == set()
    assert opened(probe(netd, f3, f"tcp,{PUBLIC},80", f"tcp,{PUBLIC},8080", expect={f"tcp,{PUBLIC},8080"})) == {f"tcp,{PUBLIC},8080"}
    netd.request("DELETE", f"/v1/snapshots/{snap}")


def test_slots_are_scrubbed_and_reused(netd):
    for _ in range(3):
        sid = new(netd, {"egress": "allow"})
        assert opened(probe(netd, sid, f"tcp,{PUBLIC},80", expect={f"tcp,{PUBLIC},80"})) == {f"tcp,{PUBLIC},80"}
        netd.delete(sid)
    wait_for(lambda: metric(netd, "hatchery_net_slots_leased") == 0, timeout=20, what="slots back")
    # The next tenant of a used slot starts from deny-all.
    sid = new(netd)
    assert opened(probe(netd, sid, f"tcp,{PUBLIC},80")) == set()


def test_crash_and_restart_keep_policies_and_leak_nothing(netd):
    keep = new(netd, {"allow": [{"cidr": PUBLIC, "ports": [80]}]}, ttl_seconds=120)
    gone = new(netd, ttl_seconds=120)
    netd.delete(gone)
    netd.crash()
    d2 = Daemon(extra_args=netd.extra_args, data_dir=netd.data_dir).start()
    d2.created |= netd.created
    try:
        assert d2.request("GET", f"/v1/sandboxes/{keep}/network").json()["allow"][0]["cidr"] == PUBLIC
        res = probe(d2, keep, f"tcp,{PUBLIC},80", f"tcp,{PUBLIC},8080")
        assert opened(res) == {f"tcp,{PUBLIC},80"}, res
        fresh = new(d2)
        assert opened(probe(d2, fresh, f"tcp,{PUBLIC},80")) == set()
    finally:
        d2.cleanup()


def test_network_off_daemon_refuses_policies(lab):
    d = Daemon(extra_args=["--pool-size", "0", "--network", "off"]).start()
    try:
        r = d.request("POST", "/v1/sandboxes", {"network": {"egress": "allow"}})
        assert r.status == 409 and "networking is off" in r.json()["error"]["message"], r
        sid = d.create(network={"egress": "deny"})
        r = d.request("PUT", f"/v1/sandboxes/{sid}/network", {"egress": "allow"})
        assert r.status == 409, r
        r = d.exec(sid, f"python3 -c \"import socket; socket.create_connection(('{PUBLIC}', 80), timeout=2)\"")
        assert r["exit_code"] != 0
    finally:
        d.cleanup()


def test_two_daemons_side_by_side_do_not_cut_each_other(netd):
    # Each daemon's table guards host forwarding; neither guard may drop the
    # other daemon's slots.
    other = Daemon(extra_args=["--pool-size", "0"]).start()
    try:
        allow = {"allow": [{"cidr": PUBLIC, "ports": [80]}]}
        mine, theirs = new(netd, allow), new(other, allow)
        for d, sid in ((netd, mine), (other, theirs)):
            assert opened(probe(d, sid, f"tcp,{PUBLIC},80", f"tcp,{PUBLIC},8080", expect={f"tcp,{PUBLIC},80"})) == {f"tcp,{PUBLIC},80"}
        assert guest_ip(netd, mine) != guest_ip(other, theirs)
    finally:
        other.cleanup()
    # The first daemon still works once the second has gone.
    assert opened(probe(netd, mine, f"tcp,{PUBLIC},80", expect={f"tcp,{PUBLIC},80"})) == {f"tcp,{PUBLIC},80"}
