"""`hatchery round create|ls|get|invite|report|replay` against the live
daemon; the candidate's part goes through the rounds API with their token."""

import json
import time
import urllib.parse

TESTS = {"test_hidden.py": "from solution import add\n\ndef test_add():\n    assert add(2, 3) == 5\n\n"
                           "def test_neg():\n    assert add(-2, 1) == -1, 'CLI-SECRET'\n"}


def test_round_commands(hx, daemon, tmp_path):
    spec = tmp_path / "round.json"
    spec.write_text(json.dumps({"name": "cli round", "starter_files": {"solution.py": "def add(a, b):\n    pass\n"},
                                "tests": {"files": TESTS}, "cpu_time_limit_ms": 1000, "session_seconds": 120}))
    rid = hx("round", "create", str(spec), check=0).stdout.strip()
    assert rid.startswith("rnd_"), rid
    assert rid in hx("round", "ls", check=0).stdout
    url = hx("round", "invite", rid, "ada@example.com", check=0).stdout.strip()
    u = urllib.parse.urlsplit(url)
    q = dict(urllib.parse.parse_qsl(u.query))
    sid, token = q["session"], u.fragment
    assert q["round"] == rid and token.startswith("hxr_")

    base = f"/v1/rounds/{rid}/sessions/{sid}"
    auth = {"Authorization": f"Bearer {token}"}
    r = daemon.request("POST", f"{base}/submit", {"files": {"solution.py": "def add(a, b):\n    return abs(a + b)\n"}},
                       auth=False, headers=auth)
    assert r.status == 202, r
    deadline = time.time() + 180
    while daemon.request("GET", base).json()["state"] != "graded":
        assert time.time() < deadline, "not graded"
        time.sleep(0.5)

    got = hx("round", "get", rid, check=0).stdout
    assert sid in got and "1/2" in got and "ada@example.com" in got
    rep = hx("round", "report", rid, sid, check=0).stdout
    assert "FAIL test_neg" in rep and "CLI-SECRET" in rep
    assert json.loads(hx("round", "report", rid, sid, "--json", check=0).stdout)["submissions"][0]["gradings"][0]["passed"] == 1

    rpl = hx("round", "replay", rid, sid, check=0).stdout.strip()
    assert rpl.startswith("rpl_")
    assert rpl in hx("round", "replay", rid, sid, "--list", check=0).stdout
    out = hx("round", "replay", rid, sid, "--fork", rpl, check=0).stdout.split()
    fork_id = out[0]
    assert fork_id.startswith("frk_") and "solution.py" in out
    assert daemon.request("DELETE", f"/v1/rounds/{rid}/forks/{fork_id}").status == 204
    assert daemon.request("POST", f"{base}/end").status == 200

    bad = hx("round", "get", "rnd_nope")
    assert bad.returncode != 0 and "round_not_found" in bad.stderr
