#!/usr/bin/env python3
"""Agent-session figures for `make bench`, each with a baseline measured in
the same run: event append (a steering message: HTTP + one SQLite
transaction + fan-out) against a bare SQLite transaction and an HTTP
round trip; SSE fan-out to 100 subscribers of one session against one
subscriber; session start queued -> running (warm pool; with and without
the repository fetch) against a pool-claim sandbox create; resume from an
idle snapshot against a plain snapshot fork. Bounded counts; all traffic
on 127.0.0.1."""

import http.client
import json
import os
import sqlite3
import sys
import tempfile
import threading
import time
from datetime import datetime

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "sessions"))

from gitserver import GitServer  # noqa: E402
from harness import KEY  # noqa: E402
from scripted_model import ScriptedModel  # noqa: E402
from sessions_support import DEMO_FILES, SCRIPTS, SessionDaemon  # noqa: E402

N_APPEND = int(os.environ.get("BENCH_SESSIONS_APPENDS", "200"))
N_FANOUT = int(os.environ.get("BENCH_SESSIONS_FANOUT_EVENTS", "30"))
SUBSCRIBERS = 100
N_START = int(os.environ.get("BENCH_SESSIONS_STARTS", "8"))
N_RESUME = int(os.environ.get("BENCH_SESSIONS_RESUMES", "4"))


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(p / 100 * (len(xs) - 1)))))]


def row(name, xs, base=None):
    p50, p99 = pct(xs, 50), pct(xs, 99)
    ratio = f"{p50 / pct(base, 50):.2f}x" if base else ""
    print(f"| {name:<58} | {len(xs):>4} | {p50:>8.2f} | {p99:>8.2f} | {ratio:>8} |", flush=True)


def header(title):
    print(f"\n### {title}\n")
    print(f"| {'operation':<58} | {'n':>4} | {'p50 ms':>8} | {'p99 ms':>8} | {'vs base':>8} |")
    print(f"|{'-' * 60}|{'-' * 6}|{'-' * 10}|{'-' * 10}|{'-' * 10}|")


def ts(s):
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


class Conn:
    def __init__(self, port):
        self.c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)

    def req(self, method, path, body=None):
        h = {"Authorization": f"Bearer {KEY}"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            h["Content-Type"] = "application/json"
        self.c.request(method, path, body=data, headers=h)
        r = self.c.getresponse()
        return r.status, r.read()


def sqlite_baseline(n):
    d = tempfile.mkdtemp(prefix="hxsb-")
    db = sqlite3.connect(os.path.join(d, "b.db"), isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("CREATE TABLE s (id TEXT PRIMARY KEY, last_seq INTEGER)")
    db.execute("CREATE TABLE e (sid TEXT, seq INTEGER, data TEXT, PRIMARY KEY (sid, seq))")
    db.execute("INSERT INTO s VALUES ('x', 0)")
    out = []
    for i in range(n):
        t = time.perf_counter()
        db.execute("BEGIN IMMEDIATE")
        seq = db.execute("UPDATE s SET last_seq = last_seq + 1 WHERE id = 'x' RETURNING last_seq").fetchone()[0]
        db.execute("INSERT INTO e VALUES ('x', ?, ?)", (seq, json.dumps({"type": "message", "text": f"m{i}"})))
        db.execute("COMMIT")
        out.append((time.perf_counter() - t) * 1000)
    db.close()
    return out


def subscriber(port, sid, after, want, arrivals, ready):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    c.request("GET", f"/v1/sessions/{sid}/events?after={after}",
              headers={"Authorization": f"Bearer {KEY}", "Accept": "text/event-stream"})
    r = c.getresponse()
    assert r.status == 200, r.status
    ready.release()
    got = 0
    mine = {}
    while got < want:
        line = r.readline()
        if not line:
            break
        if line.startswith(b"id:"):
            mine[int(line[3:])] = time.perf_counter()
            got += 1
    arrivals.append(mine)
    c.close()


def main():
    g = GitServer().start()
    m = ScriptedModel(SCRIPTS).start()
    repo = g.add_repo("bench", DEMO_FILES)
    # One running place: a waiting session holds it, so a second stays
    # queued (its log takes messages, no agent involved).
    d = SessionDaemon(m.port, extra=["--sessions-max-running", "1", "--sessions-max-streams", "1000",
                                     "--pool-size", "2"]).start()
    try:
        holder = d.new_session(repo, "[script:ask] hold the place")
        d.wait_event(holder, "waiting")
        target = d.new_session(repo, "[script:quick] stays queued")
        c = Conn(d.port)
        for _ in range(10):
            c.req("GET", "/healthz")
        base_http = []
        for _ in range(N_APPEND):
            t = time.perf_counter()
            c.req("GET", "/healthz")
            base_http.append((time.perf_counter() - t) * 1000)
        appends = []
        for i in range(N_APPEND):
            t = time.perf_counter()
            st, _ = c.req("POST", f"/v1/sessions/{target}/messages", {"text": f"m{i}"})
            appends.append((time.perf_counter() - t) * 1000)
            assert st == 202, st
        base_sql = sqlite_baseline(N_APPEND)

        def fanout(nsubs):
            last = d.session(target)["last_seq"]
            arrivals, ready = [], threading.Semaphore(0)
            threads = [threading.Thread(target=subscriber, args=(d.port, target, last, N_FANOUT, arrivals, ready))
                       for _ in range(nsubs)]
            for t in threads:
                t.start()
            for _ in threads:
                ready.acquire()
            time.sleep(0.5)
            sent = {}
            for i in range(N_FANOUT):
                t = time.perf_counter()
                _, body = c.req("POST", f"/v1/sessions/{target}/messages", {"text": f"f{i}"})
                sent[json.loads(body)["seq"]] = t
                time.sleep(0.02)
            for t in threads:
                t.join(120)
            lat = [(at - sent[seq]) * 1000 for mine in arrivals for seq, at in mine.items() if seq in sent]
            assert len(lat) == nsubs * N_FANOUT, (len(lat), nsubs * N_FANOUT)
            return lat

        one = fanout(1)
        hundred = fanout(SUBSCRIBERS)
        header("Session event log (a steering message = one event)")
        row("baseline: SQLite transaction (next seq + insert), Python", base_sql)
        row("baseline: HTTP GET /healthz, kept alive", base_http)
        row("event append: POST /v1/sessions/{id}/messages", appends, base_http)
        row("SSE delivery, 1 subscriber (baseline)", one)
        row(f"SSE delivery, {SUBSCRIBERS} subscribers of one session", hundred, one)
        c.req("POST", f"/v1/sessions/{target}:cancel")
        c.req("POST", f"/v1/sessions/{holder}:cancel")

        # Session start, warm pool: sandbox claim, checkout, agent start.
        creates = []
        for _ in range(N_START):
            time.sleep(1.5)  # the pool refills
            t = time.perf_counter()
            st, body = c.req("POST", "/v1/sandboxes", {"ttl_seconds": 60})
            creates.append((time.perf_counter() - t) * 1000)
            c.req("DELETE", f"/v1/sandboxes/{json.loads(body)['id']}")
        starts, starts_nofetch = [], []
        for _ in range(N_START):
            time.sleep(1.5)
            sid = d.new_session(repo, "[script:quick] start")
            deadline = time.time() + 120
            while d.session(sid)["state"] not in ("completed", "failed", "cancelled"):
                assert time.time() < deadline
                time.sleep(0.1)
            evs = d.all_events(sid)
            d.track_sandboxes(sid)
            at = {}
            for e in evs:
                key = e["type"] if e["type"] != "state_changed" else "to_" + e["to"]
                at.setdefault(key, ts(e["at"]))
            total = (at["to_running"] - at["to_starting"]) * 1000
            fetch = (at["repo_checked_out"] - at["repo_fetch_started"]) * 1000
            starts.append(total)
            starts_nofetch.append(total - fetch)
        header("Session start (warm pool), from the event log")
        row("baseline: POST /v1/sandboxes (pool claim)", creates)
        row("queued->running excluding repo fetch+checkout", starts_nofetch, creates)
        row("queued->running including repo fetch+checkout", starts, creates)
    finally:
        d.cleanup_sessions()

    # Resume from an idle snapshot.
    d = SessionDaemon(m.port, extra=["--sessions-idle-timeout", "1", "--pool-size", "0"]).start()
    try:
        c = Conn(d.port)
        forks = []
        st, body = c.req("POST", "/v1/sandboxes", {"ttl_seconds": 300})
        sbx = json.loads(body)["id"]
        d.created.add(sbx)
        st, body = c.req("POST", f"/v1/sandboxes/{sbx}/snapshots", {})
        snap = json.loads(body)["id"]
        for _ in range(N_RESUME):
            t = time.perf_counter()
            st, body = c.req("POST", f"/v1/snapshots/{snap}/fork", {"ttl_seconds": 60})
            forks.append((time.perf_counter() - t) * 1000)
            for s in json.loads(body)["sandboxes"]:
                d.created.add(s["id"])
                c.req("DELETE", f"/v1/sandboxes/{s['id']}")
        c.req("DELETE", f"/v1/sandboxes/{sbx}")
        c.req("DELETE", f"/v1/snapshots/{snap}")
        resumes = []
        for i in range(N_RESUME):
            sid = d.new_session(repo, "[script:ask] idle")
            d.wait_state(sid, "idle")
            d.request("POST", f"/v1/sessions/{sid}/messages", {"text": f"r{i}"})
            ev = d.wait_event(sid, "resumed")
            resumes.append(float(ev["resume_ms"]))
            d.wait_state(sid, "completed")
            d.track_sandboxes(sid)
        header("Resume from an idle snapshot")
        row("baseline: POST /v1/snapshots/{id}/fork (plain sandbox)", forks)
        row("idle -> running (fork of the session snapshot)", resumes, forks)
    finally:
        d.cleanup_sessions()
        m.stop()
        g.stop()


if __name__ == "__main__":
    main()
