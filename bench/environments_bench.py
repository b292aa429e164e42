#!/usr/bin/env python3
"""Environment figures for `make bench`, with the baseline measured in the
same run on the same daemon: session start (POST to `running`, from the
event log: session_created -> state running) from an environment's
snapshot with the delta of a few commits, against today's bare-repository
start (a pooled sandbox, the whole checkout). The environment's set-up
(a venv and a byte-compile of the standard library) is paid once, at its build, which is
reported too. All traffic on 127.0.0.1."""

import http.client
import json
import os
import shutil
import sys
import tempfile
import time
from datetime import datetime

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "sessions"))

from gitserver import GitServer, git  # noqa: E402
from harness import KEY  # noqa: E402
from scripted_model import ScriptedModel  # noqa: E402
from sessions_support import DEMO_FILES, SCRIPTS, SessionDaemon  # noqa: E402

N = int(os.environ.get("BENCH_ENV_STARTS", "8"))
AHEAD = 5
# A set-up with a real cost and no network: a venv and the standard
# library byte-compiled into a directory of its own.
SETUP = ("python3 -m venv --without-pip /opt/venv && "
         "python3 -m compileall -q -d /opt/pyc -o 1 /usr/lib/python3.11 > /dev/null 2>&1; true")


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(p / 100 * (len(xs) - 1)))))]


def row(name, xs, base=None):
    p50, p99 = pct(xs, 50), pct(xs, 99)
    ratio = f"{p50 / pct(base, 50):.2f}x" if base else ""
    print(f"| {name:<62} | {len(xs):>4} | {p50:>8.1f} | {p99:>8.1f} | {ratio:>8} |", flush=True)


def ts(s):
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


# The start's phases, from the event log: (label, from event, to event).
PHASES = [
    ("created -> sandbox requested", "session_created", "sandbox_requested"),
    ("sandbox requested -> ready (fork/claim + bind; env: + delta fetch)", "sandbox_requested",
     "sandbox_ready"),
    ("sandbox ready -> checked out (bare: fetch; unpack/apply delta)", "sandbox_ready",
     "repo_checked_out"),
    ("checked out -> running (agent files + start)", "repo_checked_out", "to_running"),
]


def start_ms(d, body, phases=None, modes=None):
    """POST a session that finishes at once; its start from the log (and
    each phase's length appended to `phases`, a dict of lists, and the
    sandbox_ready boot mode's last word to `modes`)."""
    r = d.request("POST", "/v1/sessions", {"task": "[script:quick] start", **body})
    assert r.status == 201, r
    sid = r.json()["session_id"]
    deadline = time.time() + 180
    while d.session(sid)["state"] not in ("completed", "failed", "cancelled"):
        assert time.time() < deadline, d.session(sid)
        time.sleep(0.1)
    s = d.session(sid)
    assert s["state"] == "completed", s
    d.track_sandboxes(sid)
    at = {}
    for e in d.all_events(sid):
        key = e["type"] if e["type"] != "state_changed" else "to_" + e["to"]
        at.setdefault(key, ts(e["at"]))
        if e["type"] == "sandbox_ready" and modes is not None:
            modes.append((e.get("boot_mode") or "").split()[-1])
    if phases is not None:
        for label, a, b in PHASES:
            if a in at and b in at:
                phases.setdefault(label, []).append((at[b] - at[a]) * 1000)
    return (at["to_running"] - at["session_created"]) * 1000


def push_ahead(g, name, n):
    work = tempfile.mkdtemp(prefix="hxgitw-")
    try:
        git("clone", "-q", os.path.join(g.root, name + ".git"), work)
        for i in range(n):
            with open(os.path.join(work, f"ahead{i}.txt"), "w") as f:
                f.write(f"{i}\n")
            git("add", ".", cwd=work)
            git("commit", "-q", "-m", f"ahead {i}", cwd=work)
        git("push", "-q", "origin", "main", cwd=work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def build(d, eid):
    c = http.client.HTTPConnection("127.0.0.1", d.port, timeout=900)
    c.request("POST", f"/v1/environments/{eid}:build", headers={"Authorization": f"Bearer {KEY}"})
    r = c.getresponse()
    assert r.status == 200, r.status
    last = None
    for line in r:
        if line.startswith(b"event:"):
            last = line[6:].strip().decode()
        elif line.startswith(b"data:") and last in ("done", "error"):
            data = json.loads(line[5:])
            assert last == "done", data
            return data
    raise AssertionError("build stream ended early")


def main():
    g = GitServer().start()
    m = ScriptedModel(SCRIPTS).start()
    repo = g.add_repo("envbench", DEMO_FILES)
    d = SessionDaemon(m.port, extra=["--pool-size", "2"]).start()
    try:
        # The same set-up twice: one environment keeps a warm pool of its
        # version (the default, 2), the other none (every start restores
        # the snapshot).
        r = d.request("POST", "/v1/environments", {"name": "bench", "repo": repo,
                                                     "setup": SETUP})
        assert r.status == 201, r
        eid = r.json()["environment_id"]
        r = d.request("POST", "/v1/environments", {"name": "bench-nopool", "repo": repo,
                                                     "setup": SETUP, "pool_size": 0})
        assert r.status == 201, r
        cold = r.json()["environment_id"]
        t = time.perf_counter()
        build(d, eid)
        build_ms = (time.perf_counter() - t) * 1000
        build(d, cold)
        push_ahead(g, "envbench", AHEAD)
        bare, env, hot, bare_ph, env_ph, hot_ph, modes = [], [], [], {}, {}, {}, []
        # Interleaved, so all see the same load.
        for _ in range(N):
            time.sleep(1.5)  # the pools refill
            bare.append(start_ms(d, {"repo": repo}, bare_ph))
            env.append(start_ms(d, {"environment_id": cold}, env_ph))
            hot.append(start_ms(d, {"environment_id": eid}, hot_ph, modes))
        print("\n### Session start from an environment (snapshot fork + delta) vs a bare repository\n")
        print(f"| {'operation':<62} | {'n':>4} | {'p50 ms':>8} | {'p99 ms':>8} | {'vs base':>8} |")
        print(f"|{'-' * 64}|{'-' * 6}|{'-' * 10}|{'-' * 10}|{'-' * 10}|")
        row("baseline: bare repository start (pool claim + whole checkout)", bare)
        row(f"environment start, no pool (restore + delta of {AHEAD} commits)", env, bare)
        row(f"hot environment start (pool claim + delta of {AHEAD})", hot, bare)
        row("environment build, once (set-up: venv + compileall)", [build_ms])
        print(f"\nhot starts served from the pool: {modes.count('pool')} of {len(modes)}")
        print("\n### Where a start's time goes (p50 of each phase, ms)\n")
        print(f"| {'phase':<66} | {'bare':>8} | {'no pool':>8} | {'hot':>8} |")
        print(f"|{'-' * 68}|{'-' * 10}|{'-' * 10}|{'-' * 10}|")

        def cell(xs):
            return f"{pct(xs, 50):>8.1f}" if xs else f"{'-':>8}"
        for label, _, _ in PHASES:
            print(f"| {label:<66} | {cell(bare_ph.get(label))} | {cell(env_ph.get(label))} "
                  f"| {cell(hot_ph.get(label))} |", flush=True)
        d.request("DELETE", f"/v1/environments/{eid}")
        d.request("DELETE", f"/v1/environments/{cold}")
    finally:
        d.cleanup_sessions()
        m.stop()
        g.stop()


if __name__ == "__main__":
    main()
