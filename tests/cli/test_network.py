"""`hatchery network get|set|events`, and --network on create and fork.
Run with the rest of tests/cli (`pytest -m network` selects just these)."""

import json
import time

import pytest

pytestmark = pytest.mark.network


def test_default_policy_is_deny(hx, sbx):
    p = json.loads(hx("network", "get", sbx, "--json", check=0).stdout)
    assert p["egress"] == "deny" and p.get("allow", []) == [] and p.get("deny", []) == []
    human = hx("network", "get", sbx, check=0).stdout
    assert human == "egress: deny\nallow: -\ndeny: -\n", human


def test_set_with_flags_and_with_a_policy_file(hx, sbx, tmp_path):
    out = hx("network", "set", sbx, "--allow", "203.0.113.0/24:443,80", "--allow", "pypi.example",
             "--deny", "198.51.100.7", "--json", check=0).stdout
    want = {"egress": "deny",
            "allow": [{"cidr": "203.0.113.0/24", "ports": [443, 80]}, {"host": "pypi.example"}],
            "deny": [{"cidr": "198.51.100.7/32"}]}
    applied = json.loads(out)
    assert applied["egress"] == "deny"
    assert [{k: v for k, v in r.items() if v not in (None, [])} for r in applied["allow"]] == want["allow"]
    stored = json.loads(hx("network", "get", sbx, "--json", check=0).stdout)
    assert stored == applied
    human = hx("network", "get", sbx, check=0).stdout
    assert "allow: 203.0.113.0/24:443,80 pypi.example" in human and "deny: 198.51.100.7/32" in human

    f = tmp_path / "policy.json"
    f.write_text(json.dumps({"egress": "allow", "deny": [{"cidr": "192.0.2.0/24", "ports": [22]}]}))
    applied = json.loads(hx("network", "set", sbx, "--policy", f"@{f}", "--json", check=0).stdout)
    assert applied["egress"] == "allow" and applied["deny"][0]["cidr"] == "192.0.2.0/24"
    assert json.loads(hx("network", "get", sbx, "--json", check=0).stdout)["egress"] == "allow"


def test_create_and_fork_take_a_policy(hx):
    policy = '{"egress":"deny","allow":[{"host":"pypi.example","ports":[443]}]}'
    sid = hx.create("--network", policy)
    got = json.loads(hx("network", "get", sid, "--json", check=0).stdout)
    assert got["allow"][0]["host"] == "pypi.example"
    snap = hx("snapshot", "create", sid, check=0).stdout.strip()
    fork = hx("snapshot", "fork", snap, "--network", '{"egress":"deny"}', check=0).stdout.strip()
    assert json.loads(hx("network", "get", fork, "--json", check=0).stdout).get("allow", []) == []
    hx("sandbox", "kill", sid, fork, check=0)
    hx("snapshot", "rm", snap, check=0)


def test_denied_attempts_show_up_as_events(hx, sbx):
    # 198.51.100.7 is TEST-NET-2 and egress is denied: the packet never leaves.
    hx("exec", sbx, "--timeout", "10", "--", "python3", "-c",
       "import socket; s = socket.socket(); s.settimeout(2)\n"
       "try: s.connect(('198.51.100.7', 443))\nexcept OSError as e: print('blocked', e)", check=0)
    deadline = time.time() + 10
    while True:
        events = json.loads(hx("network", "events", sbx, "--json", check=0).stdout)
        hits = [e for e in events if e["destination"] == "198.51.100.7"]
        if hits or time.time() > deadline:
            break
        time.sleep(0.5)
    assert hits and hits[-1]["port"] == 443 and hits[-1]["protocol"] == "tcp", events
    table = hx("network", "events", sbx, check=0).stdout.splitlines()
    assert table[0].split() == ["TIME", "PROTOCOL", "DESTINATION", "PORT"]
    assert any("198.51.100.7" in line and "443" in line for line in table[1:])


def test_mistakes(hx, sbx):
    ghost = "sbx_0000000000000000"
    for args in (["network", "get", ghost], ["network", "set", ghost], ["network", "events", ghost]):
        p = hx(*args)
        assert p.returncode == 1 and f"no sandbox {ghost}" in p.stderr, (args, p.stderr)
    p = hx("network", "set", sbx, "--allow", "pypi.example:https")
    assert p.returncode == 1 and "bad port" in p.stderr
    p = hx("network", "set", sbx, "--policy", "{nope")
    assert p.returncode == 1 and "not JSON" in p.stderr
    p = hx("network", "set", sbx, "--policy", '{"egress":"sometimes"}')
    assert p.returncode == 1 and "400" in p.stderr, p.stderr
    p = hx("network", "set", sbx, "--egress", "maybe")
    assert p.returncode == 2
    p = hx("sandbox", "create", "--network", "[]")
    assert p.returncode == 1 and "JSON object" in p.stderr
    assert hx.live() == [sbx]
