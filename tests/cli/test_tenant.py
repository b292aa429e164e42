"""`hatchery tenant ...` against a live daemon: make a tenant with a limit,
a key printed once, list them, the key's own view through the CLI, revoke
it, and remove the tenant."""

import json
import re


def test_tenant_and_key_lifecycle(hx):
    tid = hx("tenant", "create", "cli-t", "--live-sandboxes", "1", check=0).stdout.strip()
    assert re.fullmatch(r"ten_[0-9a-f]{16}", tid), tid
    ls = hx("tenant", "ls", check=0).stdout
    assert tid in ls and "cli-t" in ls
    t = [x for x in json.loads(hx("tenant", "ls", "--json", check=0).stdout) if x["id"] == tid][0]
    assert t["limits"]["live_sandboxes"] == 1 and t["limits"]["tokens"] is None

    made = hx("tenant", "key", "create", tid, check=0)
    key = made.stdout.strip()
    assert re.fullmatch(r"htk_[0-9a-f]{64}", key), made
    assert "shown once" in made.stderr
    keys = json.loads(hx("tenant", "key", "ls", tid, "--json", check=0).stdout)
    assert len(keys) == 1 and "key" not in keys[0] and key.startswith(keys[0]["prefix"])
    assert key[12:] not in hx("tenant", "key", "ls", tid, check=0).stdout

    # The tenant's key through the CLI: its own sandbox, its limit, no tenants.
    as_tenant = {"HATCHERY_API_KEY": key}
    sid = hx("sandbox", "create", "--ttl", "120", env=as_tenant, check=0).stdout.strip()
    p = hx("sandbox", "create", "--ttl", "120", env=as_tenant)
    assert p.returncode != 0 and "live_sandboxes" in p.stderr, p
    assert hx("tenant", "ls", env=as_tenant).returncode != 0
    p = hx("tenant", "rm", tid)
    assert p.returncode != 0 and "live sandboxes" in p.stderr, p
    hx("sandbox", "kill", sid, env=as_tenant, check=0)

    assert hx("tenant", "key", "revoke", tid, keys[0]["id"], check=0).stdout.strip() == keys[0]["id"]
    assert hx("sandbox", "ls", env=as_tenant).returncode != 0
    assert hx("tenant", "rm", tid, check=0).stdout.strip() == tid
    assert tid not in hx("tenant", "ls", check=0).stdout
    p = hx("tenant", "key", "ls", "../x")
    assert p.returncode != 0 and "not a tenant or key id" in p.stderr
