"""Playground test harness: starts hatchery-playground in front of a real
daemon (tests/integration/harness.py Daemon), posts snippets, reads the SSE
stream with arrival times, and lists what the daemon still holds."""

import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../integration"))
from harness import KEY, Daemon, free_port, metric, wait_for  # noqa: E402,F401

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
PLAYGROUND_BIN = os.environ.get(
    "HATCHERY_PLAYGROUND_BIN",
    os.path.join(os.environ.get("HATCHERY_BIN_DIR", os.path.join(REPO, "target/release")), "hatchery-playground"))
if not os.path.exists(PLAYGROUND_BIN):
    PLAYGROUND_BIN = os.path.join(REPO, "target/release/hatchery-playground")


def start_daemon(pool=2, extra=()):
    d = Daemon(extra_args=["--pool-size", str(pool), "--max-ttl", "3600", *extra]).start()
    return d


class Result:
    def __init__(self, status, headers, body=b"", events=None, times=None, t0=0.0):
        self.status = status
        self.headers = headers
        self.body = body
        self.events = events or []
        self.times = times or []
        self.t0 = t0

    def json(self):
        return json.loads(self.body)

    def error_code(self):
        return self.json()["error"]["code"]

    def named(self, name):
        return [d for e, d in self.events if e == name]

    def stdout(self):
        return "".join(d["data"] for d in self.named("stdout"))

    def stderr(self):
        return "".join(d["data"] for d in self.named("stderr"))

    def exit(self):
        ex = self.named("exit")
        assert len(ex) == 1, self.events
        return ex[0]

    def __repr__(self):
        return f"<{self.status} {self.body[:200]!r} {self.events[-3:]!r}>"


class Gateway:
    def __init__(self, daemon, args=(), env=None):
        self.daemon = daemon
        self.dir = tempfile.mkdtemp(prefix="hxpg-", dir="/tmp")
        self.db = os.path.join(self.dir, "runs.db")
        self.port = free_port()
        self.args = list(args)
        self.env = env or {}
        self.proc = None
        self.log_path = os.path.join(self.dir, "playground.log")

    def start(self):
        env = dict(os.environ, HATCHERY_URL=f"http://127.0.0.1:{self.daemon.port}", HATCHERY_API_KEY=KEY,
                   RUST_LOG="info,hatchery_playground=debug")
        env.update(self.env)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [PLAYGROUND_BIN, "--listen", f"127.0.0.1:{self.port}", "--db", self.db, *self.args],
            stdout=log, stderr=log, env=env)
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                if self.get("/healthz").status == 200:
                    return self
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError("playground exited: " + self.log())
            time.sleep(0.05)
        raise RuntimeError("playground did not start: " + self.log())

    def log(self):
        try:
            return open(self.log_path, errors="replace").read()[-4000:]
        except OSError:
            return ""

    def stop(self, sig=signal.SIGTERM):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def rss_kb(self):
        for line in open(f"/proc/{self.proc.pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def get(self, path, headers=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        conn.request("GET", path, headers=headers or {})
        r = conn.getresponse()
        res = Result(r.status, r.headers, r.read())
        conn.close()
        return res

    def request(self, method, path, body=None, headers=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        res = Result(r.status, r.headers, r.read())
        conn.close()
        return res

    def open_run(self, code, template="code-interpreter", ip=None, cookie=None, raw=None, timeout=60):
        """Posts a run; returns (conn, response) without reading the body."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        h = {"Content-Type": "application/json"}
        if ip:
            h["X-Forwarded-For"] = ip
        if cookie:
            h["Cookie"] = cookie
        body = raw if raw is not None else json.dumps({"code": code, "template": template}).encode()
        conn.request("POST", "/playground/run", body=body, headers=h)
        return conn, conn.getresponse()

    def run(self, code, template="code-interpreter", ip=None, cookie=None, raw=None, on_event=None, timeout=60):
        """Runs a snippet to the end; events carry their arrival times."""
        t0 = time.monotonic()
        conn, r = self.open_run(code, template, ip, cookie, raw, timeout)
        headers = r.headers
        if r.status != 200:
            res = Result(r.status, headers, r.read(), t0=t0)
            conn.close()
            return res
        events, times = read_sse(r, on_event)
        conn.close()
        return Result(200, headers, events=events, times=times, t0=t0)

    def metric(self, name):
        for line in self.get("/metrics").body.decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.split()[-1])
        return 0.0

    def cleanup(self):
        self.stop()
        if not os.environ.get("HATCHERY_KEEP_DATA"):
            import shutil
            shutil.rmtree(self.dir, ignore_errors=True)


def read_sse(r, on_event=None):
    events, times, event, data = [], [], None, []
    while True:
        line = r.readline()
        if not line:
            break
        line = line.decode().rstrip("\n").rstrip("\r")
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())
        elif line == "":
            if event:
                ev = (event, json.loads("\n".join(data)))
                events.append(ev)
                times.append(time.monotonic())
                if on_event and on_event(ev) is False:
                    break
            event, data = None, []
    return events, times


def read_until(r, prefix):
    """Reads the response's lines until one starts with `prefix`; fails if
    the stream ends first (instead of looping on b"" for ever)."""
    seen = []
    while True:
        line = r.readline()
        if not line:
            raise AssertionError(f"stream ended before {prefix!r}; read {seen[-10:]}")
        if line.startswith(prefix):
            return line
        seen.append(line)


def sandboxes(daemon):
    r = daemon.request("GET", "/v1/sandboxes")
    assert r.status == 200, r
    return r.json()["sandboxes"]


def assert_no_sandboxes(daemon, timeout=10):
    """Nothing the gateway made may outlive its run."""
    wait_for(lambda: not sandboxes(daemon), timeout=timeout, what="no live sandboxes")
