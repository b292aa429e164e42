"""`hatchery snapshot create|ls|get|fork|rm`."""

import json


def test_create_list_fork_remove(hx, sbx):
    hx("exec", sbx, "--", "echo before > /tmp/state", check=0)
    snap = hx("snapshot", "create", sbx, "-m", "candidate=c-42", "--retention", "3600", check=0).stdout.strip()
    assert snap.startswith("snap_") and len(snap) == 21, snap
    other = json.loads(hx("snapshot", "create", sbx, "--json", check=0).stdout)
    assert other["sandbox_id"] == sbx and other["size_bytes"] > 0

    table = hx("snapshot", "ls", check=0).stdout.splitlines()
    assert table[0].split()[:3] == ["ID", "SANDBOX", "TEMPLATE"]
    assert [line.split()[0] for line in table[1:]] == [snap, other["id"]]
    assert "candidate=c-42" in table[1]
    listed = json.loads(hx("snapshot", "ls", "--json", "-m", "candidate=c-42", check=0).stdout)
    assert [s["id"] for s in listed] == [snap]
    got = json.loads(hx("snapshot", "get", snap, "--json", check=0).stdout)
    assert got["metadata"] == {"candidate": "c-42"} and got["expires_at"] > got["created_at"]
    assert f"sandbox_id: {sbx}" in hx("snapshot", "get", snap, check=0).stdout

    hx("exec", sbx, "--", "echo after > /tmp/state", check=0)
    forks = hx("snapshot", "fork", snap, "-n", "2", "--ttl", "120", "-m", "role=reviewer", check=0).stdout.split()
    assert len(forks) == 2 and all(f.startswith("sbx_") for f in forks)
    for f in forks:
        assert hx("exec", f, "--", "cat /tmp/state", check=0).stdout == "before\n"
    assert hx("exec", sbx, "--", "cat /tmp/state", check=0).stdout == "after\n"
    mine = json.loads(hx("sandbox", "ls", "--json", "-m", "role=reviewer", check=0).stdout)
    assert sorted(s["id"] for s in mine) == sorted(forks)
    as_json = json.loads(hx("snapshot", "fork", snap, "--json", check=0).stdout)
    assert len(as_json) == 1 and as_json[0]["boot_mode"] == "fork"

    assert hx("sandbox", "kill", *forks, as_json[0]["id"], check=0).returncode == 0
    assert hx("snapshot", "rm", snap, other["id"], check=0).stdout.split() == [snap, other["id"]]
    assert json.loads(hx("snapshot", "ls", "--json", check=0).stdout) == []


def test_unknown_ids_and_bad_args(hx, sbx):
    ghost = "snap_0000000000000000"
    for args in (["snapshot", "get", ghost], ["snapshot", "fork", ghost], ["snapshot", "rm", ghost]):
        p = hx(*args)
        assert p.returncode == 1 and f"no snapshot {ghost}" in p.stderr, (args, p.stderr)
    p = hx("snapshot", "create", "sbx_0000000000000000")
    assert p.returncode == 1 and "no sandbox sbx_0000000000000000" in p.stderr
    p = hx("snapshot", "fork", sbx)
    assert p.returncode == 1 and "is not a snapshot id" in p.stderr
    snap = hx("snapshot", "create", sbx, check=0).stdout.strip()
    p = hx("snapshot", "fork", snap, "-n", "17")
    assert p.returncode == 1 and "invalid_request" in p.stderr
    p = hx("snapshot", "create", sbx, "--retention", "0")
    assert p.returncode == 1 and "invalid_request" in p.stderr
    hx("snapshot", "rm", snap, check=0)
    assert hx.live() == [sbx]
