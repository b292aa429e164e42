"""SIGKILL the daemon in the middle of `git_push` calls, 20 times at
different points (while the push is at the git server, just after, and
at random moments of a call: export, planning, recording). Every call
ends with the remote showing exactly one push for it (or none, with the
call marked needs_review), and the recorded result matches the remote."""

import json
import os
import random
import time

from broker_support import add_repo
from pushserver import pushes

HERE = os.path.dirname(__file__)
KILLS = 20
CALLS = 24


def test_sigkill_mid_push_20_times(model, git_server, push_server, forge):
    from broker_support import BrokerDaemon
    rnd = random.Random(1414)
    files = {"pusher.py": open(os.path.join(HERE, "pusher_agent.py")).read(), "README.md": "x\n"}
    repo, bare = add_repo(git_server, "crashpush", files)
    d = BrokerDaemon(model.port, git_server, push_server, forge).start()
    push_server.receive_delay = 0.3
    kills = []
    try:
        sid = d.new_session(repo, "push a lot", agent={"kind": "command", "command": f"python3 pusher.py {CALLS}"})
        d.wait_state(sid, "running")
        deadline = time.time() + 200
        while len(kills) < KILLS and time.time() < deadline:
            k = len(kills)
            seen = len(push_server.receive_started)
            if k % 2 == 0:
                # While (or just after) the push is at the git server: the
                # server finishes the push on its own after the kill.
                t_end = time.time() + 30
                while len(push_server.receive_started) <= seen and time.time() < t_end:
                    time.sleep(0.005)
                if len(push_server.receive_started) <= seen:
                    break  # the agent is done
                time.sleep([0.0, 0.1, 0.25, 0.35, 0.5][(k // 2) % 5])
                where = "at-server"
            else:
                # Anywhere in a call's life.
                time.sleep(rnd.uniform(0.05, 1.2))
                where = "random"
            if d.session(sid)["state"] in ("completed", "failed"):
                break
            d.crash()
            kills.append(where)
            d = d.restarted()
        push_server.receive_delay = 0.0
        s = d.wait_state(sid, "completed", timeout=300)
        assert len(kills) == KILLS, (kills, s)

        calls = {c["seq"]: c for c in d.calls(sid)}
        assert sorted(calls) == list(range(1, CALLS + 1))
        remote = pushes(bare)
        ref = f"refs/heads/hatchery/{sid}"
        assert all(p[2] == ref for p in remote)
        pushed = [p[1] for p in remote]
        # No commit was pushed twice, and nothing the broker did not plan was pushed.
        assert len(pushed) == len(set(pushed))
        planned = {c["effect"]["commit"]: seq for seq, c in calls.items() if c.get("effect")}
        assert set(pushed) <= set(planned), (pushed, planned)
        statuses = {}
        for seq, c in calls.items():
            statuses[c["status"]] = statuses.get(c["status"], 0) + 1
            commit = (c.get("effect") or {}).get("commit")
            if c["status"] == "done":
                assert pushed.count(commit) == 1, (seq, c)
                assert c["output"]["commit"] == commit
            elif c["status"] == "needs_review":
                assert commit not in pushed, (seq, c)
            else:
                raise AssertionError(f"call {seq} ended {c['status']}: {c}")
        # What the agent was told is what the broker recorded.
        evs = d.all_events(sid)
        told = {}
        for e in evs:
            if e["type"] == "agent_output" and e["text"].startswith("PUSH "):
                _, seq, js = e["text"].split(" ", 2)
                told[int(seq)] = json.loads(js)
        assert sorted(told) == list(range(1, CALLS + 1))
        for seq, r in told.items():
            assert r["status"] == calls[seq]["status"] and r["output"] == calls[seq]["output"], seq
        # Every call has its result event; needs_review ones say so.
        results = {}
        for e in evs:
            if e["type"] == "broker_result":
                results.setdefault(e["call_seq"], set()).add(e["status"])
        assert {k: v for k, v in results.items()} == {seq: {c["status"]} for seq, c in calls.items()}
        assert statuses.get("done", 0) >= CALLS // 2, statuses
        # The 20 kills left scratch repositories mid-push; the last start
        # removed them: one directory is left, the running broker's, empty.
        scratch = os.path.join(d.data_dir, "broker-scratch")
        roots = os.listdir(scratch)
        assert len(roots) == 1 and roots[0].startswith(f"{d.proc.pid}-"), roots
        assert os.listdir(os.path.join(scratch, roots[0])) == [], roots
        print("kills", kills, "statuses", statuses, "pushes", len(pushed))
    finally:
        push_server.receive_delay = 0.0
        d.cleanup_sessions()
