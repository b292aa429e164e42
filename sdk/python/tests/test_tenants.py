"""Tenants through the SDK against the live daemon: a tenant with limits,
a key shown once and listed without its secret, the key's own view of
sandboxes, its limit as RateLimited, a revoke refused at once, and
/v1/tenants refused to a tenant key."""

import pytest

import hatchery
from hatchery import AuthError, Conflict, PermissionDenied, RateLimited, Sandbox, Tenants


def test_tenants_roundtrip(client, url):
    t = Tenants.create("sdk-py", limits={"live_sandboxes": 1}, client=client)
    assert t.id.startswith("ten_") and t.limits["live_sandboxes"] == 1 and t.limits["tokens"] is None
    assert Tenants.get(t.id, client=client) == t
    assert t.id in {x.id for x in Tenants.list(client=client)}
    k = Tenants.create_key(t.id, client=client)
    assert k.key.startswith(k.prefix) and k.revoked_at is None
    listed = Tenants.list_keys(t.id, client=client)
    assert [x.id for x in listed] == [k.id] and "key" not in listed[0].extra

    mine = hatchery.Client(url, k.key)
    sbx = Sandbox.create(ttl_seconds=120, client=mine)
    try:
        assert sbx.info.metadata["tenant"] == t.id
        assert [s.id for s in Sandbox.list(client=mine)] == [sbx.id]
        with pytest.raises(RateLimited) as e:
            Sandbox.create(ttl_seconds=120, client=mine)
        assert e.value.code == "tenant_limit"
        with pytest.raises(PermissionDenied):
            Tenants.list(client=mine)
        with pytest.raises(Conflict):
            Tenants.delete(t.id, client=client)
    finally:
        sbx.kill()
    u = Tenants.update(t.id, name="sdk-py-2", client=client)
    assert u.name == "sdk-py-2" and u.limits == t.limits
    assert Tenants.revoke_key(t.id, k.id, client=client).revoked_at
    with pytest.raises(AuthError):
        Sandbox.list(client=mine)
    Tenants.delete(t.id, client=client)
