#!/usr/bin/env python3
"""What session checkpoints cost (issue 37 item 3), for `make bench`.

A session's agent runs one CPU-bound command that counts loop iterations
for W seconds of wall time. The same command runs in a session of a daemon
without checkpoints (the baseline) and of one checkpointing every K
seconds, alternately, R times each. The checkpointed runs do fewer
iterations because each checkpoint pauses the sandbox while runsc
serialises it and takes host CPU; the relative loss, divided by the
checkpoints taken, is one checkpoint's cost in seconds of the session's
CPU, and that cost over an interval is the share of the session's CPU
checkpointing takes at that interval (printed for the default).
The runner's own `hatchery_sessions_checkpoint_seconds` is printed beside.
Bounded: R*2 sessions of W seconds each; all traffic on 127.0.0.1."""

import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "sessions"))

from gitserver import GitServer  # noqa: E402
from scripted_model import ScriptedModel  # noqa: E402
from sessions_support import DEMO_FILES, SessionDaemon  # noqa: E402

W = int(os.environ.get("BENCH_CKPT_WALL_S", "30"))
K = int(os.environ.get("BENCH_CKPT_INTERVAL_S", "3"))
R = int(os.environ.get("BENCH_CKPT_ROUNDS", "2"))
DEFAULT_S = 60  # --sessions-checkpoint-interval's default

BURN = ("python3 -c 'import time\nt=time.time();n=0\nwhile time.time()-t<%d: n+=1\nprint(n)'" % W)


def run(d, repo):
    sid = d.new_session(repo, "[script:burn] count", budget={"tokens": 100000, "wall_s": 600})
    d.wait_state(sid, "completed", timeout=W + 240)
    evs = d.all_events(sid)
    cmd = [e for e in evs if e["type"] == "command_run"]
    assert cmd and cmd[0]["exit_code"] == 0, cmd
    ckpts = sum(1 for e in evs if e["type"] == "snapshot_taken" and e.get("purpose") == "checkpoint")
    return int(cmd[0]["output"].strip().splitlines()[-1]), ckpts


def histogram(d):
    text = d.request("GET", "/metrics").body.decode()
    get = lambda k: float(re.search(rf"^hatchery_sessions_checkpoint_seconds_{k} (\S+)$", text, re.M).group(1))
    return get("sum"), get("count")


def main():
    model = ScriptedModel({"burn": [
        {"tool_calls": [{"name": "shell", "arguments": {"command": BURN}}]},
        {"tool_calls": [{"name": "finish", "arguments": {"summary": "counted"}}]},
    ]}).start()
    git = GitServer().start()
    base = SessionDaemon(model.port, extra=["--pool-size", "0"]).start()
    ck = SessionDaemon(model.port, extra=["--pool-size", "0", "--sessions-checkpoint-interval", str(K)]).start()
    try:
        repo = git.add_repo("ckpt-cost", DEMO_FILES)
        n0, nk, taken = [], [], 0
        for _ in range(R):
            n0.append(run(base, repo)[0])
            n, c = run(ck, repo)
            nk.append(n)
            taken += c
        s, count = histogram(ck)
        loss = 1 - (sum(nk) / len(nk)) / (sum(n0) / len(n0))
        per = loss * W * R / max(taken, 1)
        print(f"\n### Session checkpoints: cost (W={W} s of CPU-bound work, K={K} s, {R} rounds)\n")
        print("| measure | value |")
        print("|---|---:|")
        print(f"| iterations, no checkpoints (mean of {R}) | {sum(n0) / len(n0):,.0f} |")
        print(f"| iterations, a checkpoint every {K} s (mean of {R}) | {sum(nk) / len(nk):,.0f} |")
        print(f"| checkpoints taken | {taken} |")
        print(f"| work lost at K={K} s | {loss * 100:.1f} % |")
        print(f"| cost of one checkpoint (session CPU) | {per:.2f} s |")
        print(f"| runner's checkpoint wall time, mean (hatchery_sessions_checkpoint_seconds) | {s / max(count, 1):.2f} s |")
        print(f"| share of the session's CPU at the default {DEFAULT_S} s | {per / DEFAULT_S * 100:.1f} % |")
    finally:
        for d in (base, ck):
            d.cleanup_sessions()
        git.stop()
        model.stop()


if __name__ == "__main__":
    main()
