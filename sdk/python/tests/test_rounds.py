"""Round and InterviewSession against the live daemon: create, invite, the
candidate's Run/stream/Submit with only their token, the reviewer's report,
a replay fork; the candidate token cannot read the report."""

import pytest

import hatchery
from hatchery import InterviewSession, Round

TESTS = {"test_hidden.py": "from solution import add\n\ndef test_add():\n    assert add(2, 3) == 5\n\n"
                           "def test_neg():\n    assert add(-2, 1) == -1, 'SDK-SECRET'\n"}


def test_round_end_to_end(daemon, client, url):
    rnd = Round.create(name="sdk round", starter_files={"solution.py": "def add(a, b):\n    pass\n"},
                       tests={"files": TESTS}, cpu_time_limit_ms=1000, session_seconds=120, client=client)
    assert rnd.state == "ready" and rnd.template_version
    assert any(r.id == rnd.id for r in Round.list(client=client))
    inv = rnd.invite("ada")
    assert inv.token and inv.url.endswith("#" + inv.token)

    cand = InterviewSession.connect(url, rnd.id, inv.id, inv.token)
    assert cand.state == "live"
    assert cand.files() == {"solution.py": "def add(a, b):\n    pass\n"}
    r = cand.run({"solution.py": "def add(a, b):\n    return a + b\nprint(add(1, 2))\n"})
    assert (r["verdict"], r["stdout"]) == ("ok", "3\n"), r
    assert cand.run({"solution.py": "while True: pass\n"})["verdict"] == "time_limit"
    events = list(cand.run_stream({"solution.py": "print('streamed')\n"}))
    assert events[-1][0] == "result" and events[-1][1]["verdict"] == "ok"
    assert "".join(d["data"] for e, d in events if e == "stdout") == "streamed\n"

    acc = cand.submit({"solution.py": "def add(a, b):\n    return abs(a + b)\n"})
    res = cand.wait_graded(acc["submission_id"], timeout=180)
    assert (res["passed"], res["total"], res["failed_cases"]) == (1, 2, ["test_neg"])
    with pytest.raises(hatchery.PermissionDenied):
        cand.report()

    # The reviewer's side, with a reviewer token.
    tok = rnd.reviewer_token(ttl_seconds=600)["token"]
    rv_round = Round.get(rnd.id, token=tok, url=url)
    (rv,) = rv_round.sessions()
    rep = rv.report()
    detail = rep["submissions"][0]["gradings"][0]["cases"]
    assert any("SDK-SECRET" in c["detail"] for c in detail)
    assert [x["verdict"] for x in rv.runs()] == ["ok", "time_limit", "ok"]
    replay = rv.replay_now()
    fork = rv_round.fork_replay(replay["id"])
    assert "solution.py" in fork.files()
    assert "abs(a + b)" in fork.read("solution.py")
    assert fork.exec(["cat", "solution.py"])["exit_code"] == 0
    fork.delete()

    assert cand.end().state == "ended"
    with pytest.raises(hatchery.Conflict):
        cand.run({})
    assert rnd.archive().state == "archived"
