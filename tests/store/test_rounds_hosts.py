"""Interview rounds on many hosts (tests/pg/pg.py): two control processes
on one PostgreSQL serve rounds from the shared tables, their sandboxes on
two hosts (each in a network namespace of its own) through the control
plane's API. A round made on one control process is served by the other;
a candidate's Run on one control process holds the session's sandbox
against a Run or Submit on the other; a control process SIGKILLed while
its grader runs is restarted and grades the stored submission once (the
other process's work is left alone); a host serves no rounds; and at the end no sandbox of a round is left on any
host, nor any network namespace or nftables table."""

import os
import sys
import threading
import time

import pytest

HERE = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, os.path.join(HERE, "..", "pg"))

from harness import Daemon, wait_for  # noqa: E402
from pg import Postgres  # noqa: E402
from test_hosts import daemon, no_net_leftovers, sql, started  # noqa: E402
from test_rounds import SOLUTION_OK, TESTS, invite, make_round, req, wait_graded  # noqa: E402

ROUNDS = ["--rounds-reap-interval", "1"]
SLEEPY = "import time\ntime.sleep(5)\nprint('slept')\n"
# The advisory lock class of a held session (crates/hatchery-rounds/src/store/pg_lock.rs).
HELD = ("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 1919837299 "
        "AND objsubid = 2 AND granted")
SLOW = {"test_slow.py": "import time\nfrom solution import add\n\ndef test_slow():\n    time.sleep(6)\n    assert add(1, 1) == 2\n"}


@pytest.fixture(scope="module")
def pg():
    p = Postgres(db="hxrounds", fabric=True).start()
    yield p
    p.stop()


def kinds_on(c, sid):
    """The round sandboxes of candidate session `sid`, every host's."""
    r = c.request("GET", f"/v1/sandboxes?metadata.hatchery.session={sid}")
    assert r.status == 200, r
    return sorted(s["metadata"].get("hatchery.kind", "") for s in r.json()["sandboxes"])


def test_rounds_on_two_control_processes(pg):
    h1 = daemon(pg, "rh-1", role="host", extra=ROUNDS)
    h2 = daemon(pg, "rh-2", role="host", extra=ROUNDS)
    c1 = daemon(pg, "rc-1", role="control", extra=ROUNDS)
    c2 = daemon(pg, "rc-2", role="control", extra=ROUNDS)
    c1b = None
    try:
        # A host serves no rounds: they are the control plane's.
        assert h1.request("GET", "/v1/rounds").status == 404

        # Made on one control process, served by the other.
        rnd = make_round(c1, tests={"files": TESTS})
        rid = rnd["id"]
        assert rnd["state"] == "ready", rnd
        assert sql(pg, f"SELECT state FROM rounds WHERE id = '{rid}'") == [["ready"]]
        assert req(c2, "GET", f"/v1/rounds/{rid}").json()["id"] == rid
        inv = invite(c2, rid)
        sid, tok = inv["id"], inv["token"]
        base = f"/v1/rounds/{rid}/sessions/{sid}"
        # The candidate's sandbox is on a host, reached through either.
        (sbx,) = [s for s, in sql(pg, f"SELECT sandbox_id FROM round_sessions WHERE id = '{sid}'")]
        (host,) = sql(pg, f"SELECT host_id FROM core_sandboxes WHERE id = '{sbx}'")[0]
        assert host in ("rh-1", "rh-2"), host
        run = req(c1, "POST", f"{base}/run", {"files": {"solution.py": SOLUTION_OK}}, token=tok).json()
        assert run["verdict"] == "ok" and run["stdout"] == "sum 5\n", run
        assert req(c2, "GET", f"{base}/files", token=tok).json()["files"]["solution.py"] == SOLUTION_OK
        # One session's sandbox serves one Run or Submit at a time,
        # whichever control process each request reached: while a Run on
        # c1 sleeps, a Run on c2 is refused and a Submit on c2 waits for it.
        slow_run = {}
        t = threading.Thread(target=lambda: slow_run.update(
            r=req(c1, "POST", f"{base}/run", {"files": {"solution.py": SLEEPY}}, token=tok)))
        t.start()
        wait_for(lambda: sql(pg, HELD) == [["1"]], timeout=10, what="c1's Run holds the session")
        r = req(c2, "POST", f"{base}/run", {"files": {"solution.py": SOLUTION_OK}}, token=tok)
        assert r.status == 409 and r.json()["error"]["code"] == "run_in_progress", r
        started_at = time.monotonic()
        r = req(c2, "POST", f"{base}/submit", {"files": {"solution.py": SOLUTION_OK}}, token=tok)
        waited = time.monotonic() - started_at
        t.join(30)
        assert r.status == 202, r
        assert slow_run["r"].status == 200 and slow_run["r"].json()["stdout"] == "slept\n", slow_run
        assert waited > 2.0, f"the Submit did not wait for the Run ({waited:.2f} s)"
        wait_for(lambda: sql(pg, HELD) == [["0"]], timeout=10, what="the session let go")
        g = wait_graded(c1, rid, sid, tok)
        assert (g["result"]["passed"], g["result"]["total"]) == (3, 3), g
        # Bad input is refused the same way on either, and writes nothing.
        for c in (c1, c2):
            r = req(c, "POST", "/v1/rounds", {"name": ""})
            assert 400 <= r.status < 500, r
        assert sql(pg, "SELECT count(*) FROM rounds") == [["1"]]

        # A control process SIGKILLed while its grader runs; the other one
        # keeps serving, and its work (none here) is not touched.
        slow = make_round(c1, tests={"files": SLOW})
        s2 = invite(c1, slow["id"])
        base2 = f"/v1/rounds/{slow['id']}/sessions/{s2['id']}"
        assert req(c1, "POST", f"{base2}/submit", {"files": {"solution.py": SOLUTION_OK}},
                   token=s2["token"]).status == 202
        wait_for(lambda: "round-grader" in kinds_on(c2, s2["id"]), timeout=60, what="grader up")
        graders = sql(pg, "SELECT id FROM core_sandboxes WHERE state IN ('starting','running') "
                          f"AND metadata->>'hatchery.session' = '{s2['id']}' "
                          "AND metadata->>'hatchery.kind' = 'round-grader'")
        assert len(graders) == 1, graders
        grader = graders[0][0]
        c1.crash()
        # The other control process serves the candidate meanwhile.
        assert req(c2, "GET", base2, token=s2["token"]).json()["state"] == "submitted"
        c1b = started(Daemon(extra_args=c1.extra_args, data_dir=c1.data_dir))
        g = wait_graded(c2, slow["id"], s2["id"], s2["token"])
        assert (g["result"]["passed"], g["result"]["total"], g["result"]["status"]) == (1, 1, "graded"), g
        # The orphaned grader was deleted, and the submission graded once.
        wait_for(lambda: "round-grader" not in kinds_on(c2, s2["id"]), timeout=60, what="graders gone")
        assert sql(pg, f"SELECT state FROM core_sandboxes WHERE id = '{grader}'")[0][0] not in ("starting", "running")
        assert sql(pg, f"SELECT metadata->>'hatchery.rounds_by' FROM core_sandboxes WHERE id = '{grader}'") == [["rc-1"]]
        sub = sql(pg, f"SELECT id FROM round_submissions WHERE session_id = '{s2['id']}'")
        assert len(sub) == 1, sub
        assert sql(pg, f"SELECT count(*) FROM round_gradings WHERE submission_id = '{sub[0][0]}'") == [["1"]]

        # End both sessions: replays are taken, the sandboxes go.
        for c, b, t in ((c2, base, tok), (c1b, base2, s2["token"])):
            e = req(c, "POST", f"{b}/end", token=t)
            assert e.status == 200 and e.json()["state"] == "ended", e
        for s in (sid, s2["id"]):
            assert kinds_on(c2, s) == [], s
        left = sql(pg, "SELECT id FROM core_sandboxes WHERE state IN ('starting','running') "
                       "AND metadata->>'hatchery.kind' IN ('round-prepare', 'round-grader', 'round-run')")
        assert left == [], left
    finally:
        # c1 itself when it was never restarted (a failure before the
        # crash, or between it and the restart): its data dir goes too.
        for c in (c1b or c1, c2):
            c.cleanup()
        h1.cleanup()
        h2.cleanup()
    no_net_leftovers(h1, h2)
