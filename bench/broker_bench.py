"""Tool broker figures (make bench): a `noop` broker call from inside a
session's sandbox through its host service, p50/p99, new keys (policy,
the call's row and its two events in one commit) and repeats (the stored answer),
against a baseline measured in the same run: the same relay and server
with no broker work (GET /v1/ping)."""

import json
import os
import sys
import time

HERE = os.path.dirname(__file__)
for p in ("integration", "sessions", "broker"):
    sys.path.insert(0, os.path.join(HERE, "..", "tests", p))

from broker_support import SCRIPTS, BrokerDaemon, add_repo  # noqa: E402
from forge import Forge  # noqa: E402
from gitserver import GitServer  # noqa: E402
from pushserver import PushServer  # noqa: E402
from scripted_model import ScriptedModel  # noqa: E402

POLICY = {"name": "bench", "rules": [{"id": "noop", "effect": "allow", "match": {"tools": ["noop"]}}]}


def main():
    g, m, f = GitServer().start(), ScriptedModel(SCRIPTS).start(), Forge().start()
    ps = PushServer(g.root).start()
    # 300 calls as fast as they go: past the default rate cap (120 new
    # calls per session and minute), which would answer 429.
    d = BrokerDaemon(m.port, g, ps, f, extra=["--broker-session-calls-per-minute", "100000"]).start()
    try:
        pid = d.request("POST", "/v1/policies", POLICY).json()["id"]
        files = {"rtt.py": open(os.path.join(HERE, "..", "tests", "broker", "rtt_agent.py")).read()}
        repo, _ = add_repo(g, "bench", files)
        sid = d.new_session(repo, "bench", policy_id=pid, agent={"kind": "command", "command": "python3 rtt.py"})
        d.wait_state(sid, "completed", timeout=300)
        line = next(e["text"] for e in d.all_events(sid)
                    if e["type"] == "agent_output" and e["text"].startswith("BENCH "))
        r = json.loads(line[6:])
        base = r["baseline"]["p50"]
        print("broker round trip from inside a sandbox (µs, 300 calls, one kept-alive connection):")
        for k, label in (("new", "noop, new seq (policy, row and 2 events, one commit)"),
                         ("repeat", "noop, repeated seq (stored answer)"),
                         ("baseline", "baseline: same relay and server, GET /v1/ping")):
            print(f"  {label:55s} p50 {r[k]['p50']:8.1f}  p99 {r[k]['p99']:8.1f}  x{r[k]['p50'] / base:.2f}")
        d.track_sandboxes(sid)
    finally:
        d.cleanup_sessions()
        ps.stop()
        f.stop()
        m.stop()
        g.stop()


if __name__ == "__main__":
    main()
