"""Tenant keys on E2B's protocol, through the official Python SDK: a
tenant's key (the SDK sends it as X-API-Key) creates sandboxes that record
its tenant whatever metadata it sends, sees and acts only on its own
(another tenant's sandbox, paused sandbox and snapshot answer as missing
ones: E2B's 404 shape), opens terminals and runs commands on its own, and
its sandboxes count against its live_sandboxes limit (429 past it)."""

import pytest
from e2b import PtySize, Sandbox, SandboxQuery
from e2b.exceptions import NotFoundException, RateLimitException

from harness import KEY


def tenant(d, name, **limits):
    r = d.request("POST", "/v1/tenants", {"name": name, "limits": limits})
    assert r.status == 201, r
    tid = r.json()["id"]
    r = d.request("POST", f"/v1/tenants/{tid}/keys")
    assert r.status == 201, r
    return tid, r.json()["key"]


def e2b(d, key, method, path, body=None):
    """A raw control-plane request with `key` as X-API-Key."""
    return d.request(method, "/e2b" + path, body, auth=False, headers={"X-API-Key": key})


def listed(key):
    return {x.sandbox_id for x in Sandbox.list(api_key=key).next_items()}


def test_a_tenant_key_reaches_only_its_own_sandboxes(daemon):
    d = daemon
    a, ka = tenant(d, "e2b-a")
    b, kb = tenant(d, "e2b-b")
    sa = Sandbox.create("base", timeout=300, metadata={"tenant": b, "app": "x"}, api_key=ka)
    sb = Sandbox.create("base", timeout=300, api_key=kb)
    snap = None
    try:
        # Its tenant is recorded over what the body said, on Hatchery's side too.
        assert sa.get_info().metadata == {"tenant": a, "app": "x"}
        r = d.request("GET", f"/v1/sandboxes/{sa.sandbox_id}", auth=False,
                      headers={"Authorization": f"Bearer {ka}"})
        assert r.status == 200 and r.json()["metadata"]["tenant"] == a, r

        # Commands, files and a terminal on its own sandbox.
        assert sa.commands.run("echo own").stdout == "own\n"
        sa.files.write("/tmp/mine.txt", "a's")
        term = sa.pty.create(PtySize(cols=80, rows=24))
        sa.pty.send_stdin(term.pid, b"echo pty-$((6*7)); exit 0\n")
        out = []
        assert term.wait(on_pty=out.append).exit_code == 0
        assert b"pty-42" in b"".join(out)

        # Lists: each tenant its own, whatever filter it sends; the operator all.
        assert sa.sandbox_id in listed(ka) and sb.sandbox_id not in listed(ka)
        assert sb.sandbox_id in listed(kb) and sa.sandbox_id not in listed(kb)
        q = SandboxQuery(metadata={"tenant": b})
        assert sb.sandbox_id not in {x.sandbox_id for x in Sandbox.list(query=q, api_key=ka).next_items()}
        assert {sa.sandbox_id, sb.sandbox_id} <= listed(KEY)

        # B's sandbox answers A as a sandbox that does not exist (E2B's 404).
        missing = sb.sandbox_id[:-1] + ("a" if sb.sandbox_id[-1] != "a" else "b")
        for sid in (sb.sandbox_id, missing):
            for method, path, body in (
                ("GET", f"/sandboxes/{sid}", None),
                ("DELETE", f"/sandboxes/{sid}", None),
                ("POST", f"/sandboxes/{sid}/timeout", {"timeout": 5}),
                ("POST", f"/sandboxes/{sid}/refreshes", {}),
                ("POST", f"/sandboxes/{sid}/connect", {"timeout": 60}),
                ("POST", f"/v2/sandboxes/{sid}/connect", {"timeout": 60}),
                ("POST", f"/sandboxes/{sid}/pause", {}),
                ("POST", f"/sandboxes/{sid}/resume", {}),
                ("POST", f"/sandboxes/{sid}/fork", {}),
                ("GET", f"/sandboxes/{sid}/metrics", None),
                ("POST", f"/sandboxes/{sid}/snapshots", {}),
                ("PUT", f"/sandboxes/{sid}/network", {}),
            ):
                r = e2b(d, ka, method, path, body)
                assert r.status == 404, (method, path, r)
                assert r.json() == {"code": 404, "message": f'sandbox "{sid}" was not found'}, r
        with pytest.raises(NotFoundException):
            Sandbox.connect(sb.sandbox_id, api_key=ka)
        assert Sandbox.kill(sb.sandbox_id, api_key=ka) is False
        # Its envd (commands, files) is not reachable with A's key either.
        r = d.request("POST", "/e2b/sandbox/filesystem.Filesystem/Stat", {"path": "/etc/hostname"},
                      auth=False, headers={"X-API-Key": ka, "E2b-Sandbox-Id": sb.sandbox_id,
                                           "Connect-Protocol-Version": "1"})
        assert r.status == 502 and "was not found" in r.body.decode(), r
        r = d.request("POST", "/e2b/sandbox/filesystem.Filesystem/Stat", {"path": "/etc/hostname"},
                      auth=False, headers={"X-API-Key": ka, "E2b-Sandbox-Id": sa.sandbox_id,
                                           "Connect-Protocol-Version": "1"})
        assert r.status == 200, r
        assert sb.is_running(), "B's sandbox is untouched"

        # Snapshots: B's is not A's to list, restore or delete.
        snap = Sandbox.create_snapshot(sb.sandbox_id, api_key=kb, name="tenant-b-snap").snapshot_id
        assert snap in {x.snapshot_id for x in Sandbox.list_snapshots(api_key=kb).next_items()}
        assert Sandbox.list_snapshots(api_key=ka).next_items() == []
        for name in (snap, "tenant-b-snap"):
            with pytest.raises(Exception, match="not found"):
                Sandbox.create(name, timeout=60, api_key=ka)
        assert Sandbox.delete_snapshot(snap, api_key=ka) is False
        r = d.request("GET", f"/v1/snapshots/{snap}")
        assert r.status == 200 and r.json()["metadata"]["tenant"] == b, r

        # A paused sandbox keeps its tenant: still B's only.
        assert sb.pause() is True
        r = e2b(d, ka, "GET", f"/sandboxes/{sb.sandbox_id}")
        assert r.status == 404, r
        with pytest.raises(NotFoundException):
            Sandbox.connect(sb.sandbox_id, api_key=ka)
        assert sb.sandbox_id not in listed(ka) and sb.sandbox_id in listed(kb)
        resumed = Sandbox.connect(sb.sandbox_id, api_key=kb)
        assert resumed.get_info().metadata.get("tenant") == b
    finally:
        if snap:
            Sandbox.delete_snapshot(snap)
        for s in (sa, sb):
            Sandbox.kill(s.sandbox_id)


def test_a_tenant_s_e2b_sandboxes_count_against_its_limit(daemon):
    d = daemon
    t, k = tenant(d, "e2b-small", live_sandboxes=2)
    one = Sandbox.create("base", timeout=300, api_key=k)
    # Hatchery's own API counts E2B's sandboxes against the same limit.
    r = d.request("POST", "/v1/sandboxes", {"ttl_seconds": 120}, auth=False,
                  headers={"Authorization": f"Bearer {k}"})
    assert r.status == 201, r
    v1 = r.json()["id"]
    try:
        with pytest.raises(RateLimitException, match="live_sandboxes"):
            Sandbox.create("base", timeout=60, api_key=k)
        r = e2b(d, k, "POST", f"/sandboxes/{one.sandbox_id}/fork", {"count": 1})
        assert r.status == 201 and r.json()[0]["error"]["code"] == 429, r
        assert len(listed(k)) == 2
        # A pause frees its room; a resume past the limit is refused.
        assert one.pause() is True
        other = Sandbox.create("base", timeout=300, api_key=k)
        try:
            with pytest.raises(RateLimitException):
                Sandbox.connect(one.sandbox_id, api_key=k)
        finally:
            other.kill()
        resumed = Sandbox.connect(one.sandbox_id, api_key=k)
        assert resumed.commands.run("echo back").stdout == "back\n"
        # The tenant is in use while it has live sandboxes.
        r = d.request("DELETE", f"/v1/tenants/{t}")
        assert r.status == 409, r
    finally:
        Sandbox.kill(one.sandbox_id)
        d.request("DELETE", f"/v1/sandboxes/{v1}")
    # The operator is not limited by the tenant's limit, and a made-up key is 401.
    r = e2b(d, "htk_" + "0" * 64, "GET", "/v2/sandboxes")
    assert r.status == 401, r
    assert d.request("DELETE", f"/v1/tenants/{t}").status == 204
