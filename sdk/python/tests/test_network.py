"""Network policy API (GET/PUT /v1/sandboxes/{id}/network, .../events, and
`network` on create and fork)."""

import time

import pytest

from hatchery import BadRequest, NetworkEvent, NetworkPolicy, NetworkRule, Sandbox

import support

pytestmark = pytest.mark.network


def test_network_policy_default_update_events(daemon, client):
    with Sandbox.create(ttl_seconds=60, client=client) as s:
        daemon.created.add(s.id)
        assert s.network.get() == NetworkPolicy(egress="deny")
        want = NetworkPolicy(egress="deny", allow=[NetworkRule(cidr="203.0.113.0/24", ports=[9, 443])])
        assert s.network.update(want) == want
        assert s.network.get() == want
        got = s.network.update({"egress": "deny", "deny": [{"host": support.NET_HOST}]})
        assert got.deny == [NetworkRule(host=support.NET_HOST)] and got.allow == []
        with pytest.raises(BadRequest):
            s.network.update({"egress": "sometimes"})
        with pytest.raises(BadRequest):
            s.network.update({"egress": "deny", "allow": [{"cidr": "203.0.113.0/24", "host": "both.example"}]})
        s.network.update(NetworkPolicy(egress="deny"))
        s.exec("python3 -c \"import socket; s=socket.socket(); s.settimeout(2); s.connect_ex(('198.51.100.7', 443))\"",
               timeout_seconds=10)
        # Denied attempts reach the event log asynchronously (the host's
        # packet log is read in the background): wait, bounded.
        deadline = time.monotonic() + 30
        while True:
            evs = s.network.events()
            assert all(isinstance(e, NetworkEvent) for e in evs)
            if any(e.destination == "198.51.100.7" and e.port == 443 and e.protocol == "tcp" for e in evs):
                break
            assert time.monotonic() < deadline, evs
            time.sleep(0.2)
        # Exact, where the log is rate-limited: at least every logged one.
        total = s.network.denied_total()
        assert isinstance(total, int) and total >= len(evs) >= 1, (total, evs)


def test_network_on_create_and_fork(daemon, client):
    policy = NetworkPolicy(egress="deny", allow=[NetworkRule(host=support.NET_HOST, ports=[443])])
    with Sandbox.create(ttl_seconds=60, network=policy, client=client) as s:
        daemon.created.add(s.id)
        assert s.network.get() == policy
        snap = s.snapshot()
        with snap.fork(ttl_seconds=60, network={"egress": "deny", "allow": [{"cidr": "203.0.113.0/24"}]}) as f:
            daemon.created.add(f.id)
            assert f.network.get() == NetworkPolicy(egress="deny", allow=[NetworkRule(cidr="203.0.113.0/24")])
        with snap.fork(ttl_seconds=60) as f:
            daemon.created.add(f.id)
            assert f.network.get() == NetworkPolicy(egress="deny")  # forks do not inherit
        snap.delete()
