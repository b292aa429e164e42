"""`hatchery sandbox create|ls|get|ttl|kill`."""

import json
import time


def test_create_prints_only_the_id_and_json_gives_the_object(hx):
    sid = hx.create("--ttl", "120", "-m", "owner=alice", "--metadata", "team=x", "-e", "GREETING=hi")
    assert hx.live() == [sid]
    full = json.loads(hx("sandbox", "create", "--json", check=0).stdout)
    assert full["id"].startswith("sbx_") and full["state"] == "running"
    assert full["boot_mode"] in ("restore", "cold", "pool") and full["template"] == "code-interpreter"
    # The create-time env reaches every exec.
    assert hx("exec", sid, "--", "echo $GREETING", check=0).stdout == "hi\n"
    got = json.loads(hx("sandbox", "get", sid, "--json", check=0).stdout)
    assert got["metadata"] == {"owner": "alice", "team": "x"}
    assert hx("sandbox", "kill", sid, full["id"], check=0).stdout.split() == [sid, full["id"]]
    assert hx.live() == []


def test_ls_table_json_and_metadata_filter(hx):
    a = hx.create("-m", "owner=alice", "-m", "role=a b")
    b = hx.create("-m", "owner=bob")
    table = hx("sandbox", "ls", check=0).stdout.splitlines()
    assert table[0].split() == ["ID", "TEMPLATE", "STATE", "CREATED", "EXPIRES", "IN", "METADATA"]
    assert [line.split()[0] for line in table[1:]] == [a, b]
    assert "owner=alice,role=a b" in table[1] and "running" in table[1]
    listed = json.loads(hx("sandbox", "ls", "--json", check=0).stdout)
    assert [s["id"] for s in listed] == [a, b]
    only = json.loads(hx("sandbox", "ls", "--json", "-m", "owner=alice", "-m", "role=a b", check=0).stdout)
    assert [s["id"] for s in only] == [a]
    assert json.loads(hx("sandbox", "ls", "--json", "-m", "owner=carol", check=0).stdout) == []
    assert hx("sandbox", "ls", "-m", "owner=carol", check=0).stdout.splitlines()[1:] == []
    # kill --all narrowed by metadata only takes those.
    assert hx("sandbox", "kill", "--all", "-m", "owner=bob", check=0).stdout.split() == [b]
    assert hx.live() == [a]
    assert hx("sandbox", "kill", "--all", check=0).stdout.split() == [a]


def test_get_human_and_ttl(hx, sbx):
    out = hx("sandbox", "get", sbx, check=0).stdout
    assert f"id:         {sbx}" in out and "state:      running" in out and "expires in:" in out
    before = json.loads(hx("sandbox", "get", sbx, "--json", check=0).stdout)["expires_at"]
    time.sleep(1.1)
    new = hx("sandbox", "ttl", sbx, "1800", check=0).stdout.strip()
    assert new > before
    assert json.loads(hx("sandbox", "get", sbx, "--json", check=0).stdout)["expires_at"] == new
    as_json = json.loads(hx("sandbox", "ttl", sbx, "900", "--json", check=0).stdout)
    assert as_json["id"] == sbx and as_json["expires_at"] < new


def test_unknown_ids_say_so(hx):
    ghost = "sbx_0000000000000000"
    for args in (["sandbox", "get", ghost], ["sandbox", "ttl", ghost, "60"], ["sandbox", "kill", ghost]):
        p = hx(*args)
        assert p.returncode == 1, (args, p)
        assert f"no sandbox {ghost}" in p.stderr and "sandbox ls" in p.stderr, p.stderr
    p = hx("sandbox", "get", "snap_0000000000000000")
    assert p.returncode == 1 and "is not a sandbox id" in p.stderr
    # A bad id among good ones: the good ones still go, the status says not all did.
    good = hx.create()
    p = hx("sandbox", "kill", ghost, "bogus", good)
    assert p.returncode == 1 and p.stdout.split() == [good], p
    assert "bogus" in p.stderr and ghost in p.stderr
    assert hx.live() == []


def test_bad_arguments(hx):
    p = hx("sandbox", "create", "-m", "novalue")
    assert p.returncode == 1 and "--metadata must be KEY=VALUE" in p.stderr
    p = hx("sandbox", "create", "--ttl", "999999")
    assert p.returncode == 1 and "invalid_request" in p.stderr and "ttl" in p.stderr, p.stderr
    p = hx("sandbox", "create", "--template", "no-such-template")
    assert p.returncode == 1 and "template_not_found" in p.stderr, p.stderr
    p = hx("sandbox", "create", "--ttl", "soon")
    assert p.returncode == 2 and "invalid value" in p.stderr
    p = hx("sandbox", "kill")
    assert p.returncode == 2
    p = hx("sandbox", "kill", "-m", "a=b", "sbx_0000000000000000")
    assert p.returncode == 1 and "only together with --all" in p.stderr
    p = hx("sandbox", "explode")
    assert p.returncode == 2 and "unrecognized subcommand" in p.stderr
    assert hx.live() == []
