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

    # show and update: a named limit changes, the others keep their value.
    hx("tenant", "update", tid, "--tokens", "5000", "--wall-clock-seconds", "60", check=0)
    t = json.loads(hx("tenant", "show", tid, "--json", check=0).stdout)
    assert t["limits"] == {"tokens": 5000, "usd_cents": None, "concurrent_sessions": None,
                           "live_sandboxes": 1, "wall_clock_seconds": 60}, t
    shown = hx("tenant", "update", tid, "--name", "cli-t2", "--unlimited", "wall_clock_seconds",
               check=0).stdout
    assert "cli-t2" in shown and "5000" in shown, shown
    t = json.loads(hx("tenant", "show", tid, "--json", check=0).stdout)
    assert t["name"] == "cli-t2" and t["limits"]["wall_clock_seconds"] is None
    assert t["limits"]["live_sandboxes"] == 1 and t["limits"]["tokens"] == 5000
    for bad, says in ((["--unlimited", "bogus"], "not a limit"),
                      (["--tokens", "1", "--unlimited", "tokens"], "contradict"),
                      ([], "nothing to change")):
        p = hx("tenant", "update", tid, *bad)
        assert p.returncode != 0 and says in p.stderr, p
    p = hx("tenant", "show", "ten_0000000000000000")
    assert p.returncode != 0 and "tenant_not_found" in p.stderr, p

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
