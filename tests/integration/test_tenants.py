"""Tenants through the live daemon: the operator makes tenants and keys;
a tenant key sees and acts only on its tenant's sandboxes and snapshots
(another tenant's answer exactly as a missing one: 404), its list shows
only its own, a revoked key is refused at once, /v1/tenants is the
operator's only, and a live_sandboxes limit holds under concurrent
creates (429 tenant_limit). Terminals too: a tenant key attaches to its
own sandbox's terminal and gets 404 before the upgrade for another's."""

import threading

import pytest

from wsclient import Refused, Term, WebSocket

SHARED_DAEMON = True


def as_key(d, key, method, path, body=None, **kw):
    return d.request(method, path, body, auth=False,
                     headers={"Authorization": f"Bearer {key}"}, **kw)


def tenant(d, name, **limits):
    r = d.request("POST", "/v1/tenants", {"name": name, "limits": limits})
    assert r.status == 201, r
    tid = r.json()["id"]
    r = d.request("POST", f"/v1/tenants/{tid}/keys")
    assert r.status == 201, r
    k = r.json()
    assert k["key"].startswith("htk_") and k["key"].startswith(k["prefix"]), k
    return tid, k


def create(d, key, **body):
    r = as_key(d, key, "POST", "/v1/sandboxes", dict({"ttl_seconds": 300}, **body))
    if r.status == 201:
        d.created.add(r.json()["id"])
    return r


def test_a_tenant_key_reaches_only_its_own(daemon):
    d = daemon
    a, ka = tenant(d, "a")
    b, kb = tenant(d, "b")
    # Keys are listed without their secret.
    listed = d.request("GET", f"/v1/tenants/{a}/keys").json()["keys"]
    assert [k["id"] for k in listed] == [ka["id"]] and "key" not in listed[0]
    assert ka["key"][12:] not in str(listed)
    for key in (ka["key"], kb["key"]):
        for method, path in (("GET", "/v1/tenants"), ("POST", "/v1/tenants"),
                             ("GET", f"/v1/tenants/{a}"), ("POST", f"/v1/tenants/{a}/keys")):
            r = as_key(d, key, method, path, {"name": "x"} if method == "POST" else None)
            assert r.status == 403 and r.error_code() == "forbidden", (method, path, r)

    # A tenant cannot claim another's name in its metadata.
    r = create(d, ka["key"], metadata={"tenant": b, "app": "x"})
    assert r.status == 201, r
    sa = r.json()["id"]
    assert r.json()["metadata"] == {"tenant": a, "app": "x"}, r
    r = create(d, kb["key"])
    assert r.status == 201, r
    sb = r.json()["id"]

    r = as_key(d, ka["key"], "POST", f"/v1/sandboxes/{sa}/exec", {"cmd": "echo mine"})
    assert r.status == 200 and r.json()["stdout"] == "mine\n", r

    # B's sandbox answers A exactly as a sandbox that does not exist.
    missing = sb[:4] + ("a" if sb[4] != "a" else "b") + sb[5:]
    for sid in (sb, missing):
        for method, path, body in (
            ("GET", f"/v1/sandboxes/{sid}", None),
            ("POST", f"/v1/sandboxes/{sid}/exec", {"cmd": "true"}),
            ("DELETE", f"/v1/sandboxes/{sid}", None),
            ("POST", f"/v1/sandboxes/{sid}/snapshots", {}),
            ("GET", f"/v1/sandboxes/{sid}/files?path=/etc/hostname", None),
        ):
            r = as_key(d, ka["key"], method, path, body)
            assert r.status == 404 and r.error_code() == "sandbox_not_found", (method, path, r)
            assert sid in r.json()["error"]["message"] or sid == missing, r
    assert d.request("GET", f"/v1/sandboxes/{sb}").status == 200, "B's sandbox is untouched"

    ids = lambda r: sorted(s["id"] for s in r.json()["sandboxes"])
    assert ids(as_key(d, ka["key"], "GET", "/v1/sandboxes")) == [sa]
    assert ids(as_key(d, ka["key"], "GET", f"/v1/sandboxes?metadata.tenant={b}")) == [sa]
    assert ids(as_key(d, kb["key"], "GET", "/v1/sandboxes")) == [sb]
    assert set(ids(d.request("GET", "/v1/sandboxes"))) >= {sa, sb}, "the operator sees all"

    # Snapshots: B's is not A's to read, fork or delete.
    r = as_key(d, kb["key"], "POST", f"/v1/sandboxes/{sb}/snapshots", {})
    assert r.status == 201, r
    snap = r.json()["id"]
    assert r.json()["metadata"].get("tenant") == b, r
    for method, path, body in (("GET", f"/v1/snapshots/{snap}", None),
                               ("POST", f"/v1/snapshots/{snap}/fork", {}),
                               ("DELETE", f"/v1/snapshots/{snap}", None)):
        r = as_key(d, ka["key"], method, path, body)
        assert r.status == 404 and r.error_code() == "snapshot_not_found", (method, path, r)
    assert as_key(d, ka["key"], "GET", "/v1/snapshots").json()["snapshots"] == []
    assert [s["id"] for s in as_key(d, kb["key"], "GET", "/v1/snapshots").json()["snapshots"]] == [snap]

    # Operator-only routes. (Policies are tenant-scoped: tests/sessions/test_sessions_tenants.py.)
    for method, path in (("GET", "/metrics"), ("POST", "/v1/templates")):
        r = as_key(d, ka["key"], method, path, {} if method == "POST" else None)
        assert r.status == 403 and r.error_code() == "forbidden", (path, r)
    assert as_key(d, ka["key"], "GET", "/v1/templates").status == 200
    # Templates are read, not their builds: a build's log is the operator's.
    name = as_key(d, ka["key"], "GET", "/v1/templates").json()["templates"][0]["name"]
    assert as_key(d, ka["key"], "GET", f"/v1/templates/{name}").status == 200
    r = as_key(d, ka["key"], "GET", f"/v1/templates/{name}/builds/bld_0123456789abcdef/events")
    assert r.status == 403 and r.error_code() == "forbidden", r

    # A tenant with live sandboxes is not deleted.
    r = d.request("DELETE", f"/v1/tenants/{b}")
    assert r.status == 409 and r.error_code() == "tenant_in_use", r

    # Revoked: refused on the very next request.
    assert as_key(d, ka["key"], "GET", "/v1/sandboxes").status == 200
    r = d.request("DELETE", f"/v1/tenants/{a}/keys/{ka['id']}")
    assert r.status == 200 and r.json()["revoked_at"], r
    r = as_key(d, ka["key"], "GET", "/v1/sandboxes")
    assert r.status == 401 and r.error_code() == "unauthorized", r
    assert as_key(d, ka["key"], "GET", f"/v1/sandboxes/{sa}").status == 401
    assert as_key(d, kb["key"], "GET", "/v1/sandboxes").status == 200, "B's key still works"

    assert as_key(d, kb["key"], "DELETE", f"/v1/snapshots/{snap}").status == 204
    assert as_key(d, kb["key"], "DELETE", f"/v1/sandboxes/{sb}").status == 204
    assert d.request("DELETE", f"/v1/sandboxes/{sa}").status == 204


def test_live_sandboxes_limit_holds_under_concurrent_creates(daemon):
    d = daemon
    t, k = tenant(d, "small", live_sandboxes=2)
    results = []
    lock = threading.Lock()

    def one():
        r = create(d, k["key"])
        with lock:
            results.append(r)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    ok = [r for r in results if r.status == 201]
    refused = [r for r in results if r.status != 201]
    assert len(ok) == 2, results
    for r in refused:
        assert r.status == 429 and r.error_code() == "tenant_limit", r
        assert "live_sandboxes" in r.json()["error"]["message"], r
    assert len(as_key(d, k["key"], "GET", "/v1/sandboxes").json()["sandboxes"]) == 2
    sid = ok[0].json()["id"]
    # Room again once one is gone.
    assert as_key(d, k["key"], "DELETE", f"/v1/sandboxes/{sid}").status == 204
    r = create(d, k["key"])
    assert r.status == 201, r
    r = create(d, k["key"])
    assert r.status == 429 and r.error_code() == "tenant_limit", r
    # The operator is not limited by a tenant's limit.
    r = d.request("POST", "/v1/sandboxes", {"ttl_seconds": 60})
    assert r.status == 201, r
    d.created.add(r.json()["id"])


def test_forks_count_against_live_sandboxes(daemon):
    d = daemon
    t, k = tenant(d, "forks", live_sandboxes=2)
    r = create(d, k["key"])
    assert r.status == 201, r
    sid = r.json()["id"]
    r = as_key(d, k["key"], "POST", f"/v1/sandboxes/{sid}/snapshots", {})
    assert r.status == 201, r
    snap = r.json()["id"]
    r = as_key(d, k["key"], "POST", f"/v1/snapshots/{snap}/fork", {"count": 2, "ttl_seconds": 120})
    assert r.status == 429 and r.error_code() == "tenant_limit", r
    r = as_key(d, k["key"], "POST", f"/v1/snapshots/{snap}/fork", {"count": 1, "ttl_seconds": 120})
    assert r.status == 201, r
    forked = r.json()["sandboxes"]
    d.created.update(s["id"] for s in forked)
    assert [s["metadata"].get("tenant") for s in forked] == [t], forked
    assert len(as_key(d, k["key"], "GET", "/v1/sandboxes").json()["sandboxes"]) == 2
    assert as_key(d, k["key"], "DELETE", f"/v1/snapshots/{snap}").status == 204


def test_a_tenant_key_opens_terminals_on_its_own_sandboxes_only(daemon):
    d = daemon
    a, ka = tenant(d, "term-a")
    b, kb = tenant(d, "term-b")
    r = create(d, ka["key"])
    assert r.status == 201, r
    sa = r.json()["id"]
    r = create(d, kb["key"])
    assert r.status == 201, r
    sb = r.json()["id"]
    bearer = lambda k: {"Authorization": f"Bearer {k['key']}"}

    # Its own: a working terminal over its key, and a token it may mint.
    t = Term(WebSocket(d.port, f"/v1/sandboxes/{sa}/pty?cmd=sh", bearer(ka)))
    t.type("echo te''rminal-$((6*7))\r")
    t.wait_for("terminal-42")
    t.ws.close()
    r = as_key(d, ka["key"], "POST", f"/v1/sandboxes/{sa}/pty/token")
    assert r.status == 200 and r.json()["token"], r

    # Another's: 404 before the upgrade, as a missing sandbox, for the
    # attach and for minting a token; a made-up key is 401.
    missing = sb[:4] + ("a" if sb[4] != "a" else "b") + sb[5:]
    for sid in (sb, missing):
        with pytest.raises(Refused) as e:
            WebSocket(d.port, f"/v1/sandboxes/{sid}/pty", bearer(ka))
        assert e.value.status == 404 and e.value.error_code() == "sandbox_not_found", e.value
        r = as_key(d, ka["key"], "POST", f"/v1/sandboxes/{sid}/pty/token")
        assert r.status == 404 and r.error_code() == "sandbox_not_found", r
    with pytest.raises(Refused) as e:
        WebSocket(d.port, f"/v1/sandboxes/{sa}/pty", {"Authorization": "Bearer htk_" + "0" * 64})
    assert e.value.status == 401, e.value
    # B's own key still reaches B's.
    t = Term(WebSocket(d.port, f"/v1/sandboxes/{sb}/pty?cmd=sh", bearer(kb)))
    t.type("echo b-''ok\r")
    t.wait_for("b-ok")
    t.ws.close()
    for sid in (sa, sb):
        assert d.request("DELETE", f"/v1/sandboxes/{sid}").status == 204
