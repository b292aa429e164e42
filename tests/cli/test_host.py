"""`hatchery host ls|get|cordon|uncordon|drain` against the one `all`
daemon (its own only host)."""

import json


def test_host_ls_get_cordon_drain_uncordon(hx):
    p = hx("host", "ls", check=0)
    lines = p.stdout.splitlines()
    assert lines[0].split()[:3] == ["ID", "STATE", "ADDRESS"], p.stdout
    assert len(lines) == 2 and " ready " in lines[1], p.stdout
    hosts = json.loads(hx("host", "ls", "--json", check=0).stdout)
    host = hosts[0]["id"]
    assert hosts[0]["state"] == "ready"
    got = hx("host", "get", host, check=0).stdout
    assert f"id:         {host}" in got and "state:      ready" in got, got
    try:
        assert hx("host", "cordon", host, check=0).stdout.strip() == f"{host} cordoned"
        p = hx("sandbox", "create", "--ttl", "60")
        assert p.returncode == 1 and "host_cordoned" in p.stderr, p
        assert hx("host", "drain", host, check=0).stdout.strip() == f"{host} draining"
        out = json.loads(hx("host", "get", host, "--json", check=0).stdout)
        assert out["state"] == "draining", out
    finally:
        assert hx("host", "uncordon", host, check=0).stdout.strip() == f"{host} ready"
    sid = hx.create("--ttl", "60")
    hx("sandbox", "kill", sid, check=0)


def test_host_errors_say_what_to_do(hx):
    p = hx("host", "get", "no-such-host")
    assert p.returncode == 1 and "no host no-such-host" in p.stderr, p
    p = hx("host", "cordon", "Not A Host")
    assert p.returncode == 1 and "is not a host id" in p.stderr, p
