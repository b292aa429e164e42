#!/usr/bin/env python3
"""Environment figures for `make bench`, with the baseline measured in the
same run on the same daemon: session start (POST to `running`, from the
event log: session_created -> state running) from an environment's
snapshot with the delta of a few commits, against today's bare-repository
start (a pooled sandbox, the whole checkout). The environment's set-up
(a venv and a byte-compile of the standard library) is paid once, at its build, which is
reported too. Then an environment whose set-up pip-installs real packages
(jinja2 and markupsafe, pinned in bench/env-index-requirements.txt) from
a package index of this bench's own, served in a network namespace it
creates: built once, its hot starts against those of an environment that
installed nothing. All traffic on 127.0.0.1 or to that namespace.
BENCH_ENV_ONLY=starts or =packages runs one part."""

import http.client
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "sessions"))

from gitserver import GitServer, git  # noqa: E402
from harness import KEY, agent_templates  # noqa: E402
from netlab import Peer  # noqa: E402
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


def finished_session(d, body):
    """POST a session with `body`, wait for it to complete; its id (its
    sandboxes tracked for the daemon's teardown check)."""
    r = d.request("POST", "/v1/sessions", body)
    assert r.status == 201, r
    sid = r.json()["session_id"]
    deadline = time.time() + 180
    while d.session(sid)["state"] not in ("completed", "failed", "cancelled"):
        assert time.time() < deadline, d.session(sid)
        time.sleep(0.1)
    s = d.session(sid)
    assert s["state"] == "completed", s
    d.track_sandboxes(sid)
    return sid


def start_ms(d, body, phases=None, modes=None):
    """POST a session that finishes at once; its start from the log (and
    each phase's length appended to `phases`, a dict of lists, and the
    sandbox_ready boot mode's last word to `modes`)."""
    sid = finished_session(d, {"task": "[script:quick] start", **body})
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


# Not 80, 8080 or 7: the peer serves those itself (netlab.py).
INDEX_PORT = 3141
PKG = "jinja2==3.1.6"
# Run by the session: the set-up's package imports, and the index the
# set-up installed it from is out of reach (the session's egress is its
# own, never the set-up's).
CHECK = ("import json, socket, sys; sys.path.insert(0, '/opt/pydeps'); import jinja2, markupsafe; "
         "s = socket.socket(); s.settimeout(2)\n"
         "try:\n    s.connect(({addr!r}, {port})); reach = 'open'\n"
         "except Exception as e:\n    reach = 'blocked:' + type(e).__name__\n"
         "print(json.dumps({{'jinja2': jinja2.__version__, 'index': reach}}))")


# A static file server (text/html for the index pages). Not `python3 -m
# http.server`: its bind looks the address up in DNS (getfqdn), which in a
# namespace without a resolver stalls for seconds before it listens.
INDEX_SERVER = """
import functools, http.server, socketserver, sys
class Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
files = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[3])
Server((sys.argv[1], int(sys.argv[2])), files).serve_forever()
"""


def package_index(peer):
    """A PEP 503 index of our own: `simple/<project>/` directories of the
    pinned wheels (bench/env-index-requirements.txt, fetched once into the
    test cache), served over HTTP by python3 -m http.server inside the
    peer's network namespace. Returns (server process, temp dir)."""
    wheels = subprocess.check_output(
        ["/usr/bin/python3", os.path.join(HERE, "..", "tests", "cache.py"), "wheels", "envindex",
         os.path.join(HERE, "env-index-requirements.txt")], text=True).strip()
    root = tempfile.mkdtemp(prefix="hxidx-")
    projects = {}
    for whl in sorted(os.listdir(wheels)):
        project = whl.split("-")[0].lower().replace("_", "-")
        projects.setdefault(project, []).append(whl)
        os.makedirs(os.path.join(root, "simple", project), exist_ok=True)
        shutil.copy(os.path.join(wheels, whl), os.path.join(root, "simple", project, whl))

    def page(path, names):
        # Written out, not http.server's listing: pip wants text/html.
        links = "".join(f'<a href="{n}">{n.rstrip("/")}</a>\n' for n in names)
        with open(os.path.join(root, path, "index.html"), "w") as f:
            f.write(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
    page("simple", [p + "/" for p in projects])
    for project, files in projects.items():
        page(os.path.join("simple", project), files)
    srv = subprocess.Popen(["ip", "netns", "exec", peer.ns, "/usr/bin/python3", "-c", INDEX_SERVER,
                            peer.addr, str(INDEX_PORT), root],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_index(srv, peer)
    except BaseException:
        srv.kill()
        srv.wait()
        shutil.rmtree(root, ignore_errors=True)
        raise
    return srv, root


def wait_index(srv, peer):
    deadline = time.time() + 10
    while True:
        assert srv.poll() is None, "the package index exited (its port taken?)"
        try:
            c = http.client.HTTPConnection(peer.addr, INDEX_PORT, timeout=1)
            c.request("GET", "/simple/jinja2/")
            r = c.getresponse()
            assert r.status == 200 and r.getheader("Content-Type", "").startswith("text/html")
            break
        except (OSError, AssertionError):
            assert time.time() < deadline, "the package index did not come up"
            time.sleep(0.1)


def command_output(d, eid, command):
    sid = finished_session(d, {"environment_id": eid, "task": "check",
                               "agent": {"kind": "command", "command": command}})
    return "".join(e["text"] for e in d.all_events(sid) if e["type"] == "agent_output")


def packages_phase(m, g):
    """Issue 40's target: an environment whose set-up pip-installs real
    packages from a local index is built once, and then a session costs
    what a session of an environment that installed nothing costs."""
    peer = Peer().up()
    try:
        srv, root = package_index(peer)
    except BaseException:
        peer.down()
        raise
    repo = g.add_repo("envpkgs", DEMO_FILES)
    try:
        d = SessionDaemon(m.port, templates_dir=agent_templates(), extra=["--pool-size", "0"]).start()
    except BaseException:
        stop_index(srv, root, peer)
        raise
    try:
        setup = (f"pip3 install -q --no-cache-dir --disable-pip-version-check --target /opt/pydeps "
                 f"--index-url http://{peer.addr}:{INDEX_PORT}/simple/ --trusted-host {peer.addr} {PKG}")
        envs = {}
        for name, script, allow in (("pkgs", setup, [{"cidr": peer.addr}]), ("plain", "true", [])):
            r = d.request("POST", "/v1/environments", {"name": name, "repo": repo, "template": "agent-session",
                                                         "setup": script, "setup_allow": allow})
            assert r.status == 201, r
            eid = r.json()["environment_id"]
            t = time.perf_counter()
            build(d, eid)
            envs[name] = (eid, (time.perf_counter() - t) * 1000)
        out = command_output(d, envs["pkgs"][0], "python3 -c " + shlex.quote(
            CHECK.format(addr=peer.addr, port=INDEX_PORT)))
        got = json.loads(out[out.index("{"):out.rindex("}") + 1])
        assert got["jinja2"] == "3.1.6" and got["index"].startswith("blocked"), got
        pkgs, plain, modes = [], [], []
        for _ in range(N):
            time.sleep(1.5)  # the pools refill
            pkgs.append(start_ms(d, {"environment_id": envs["pkgs"][0]}, None, modes))
            plain.append(start_ms(d, {"environment_id": envs["plain"][0]}, None, modes))
        print("\n### An environment that pip-installs from a local index: built once, free per session\n")
        print(f"set-up: `pip3 install --target /opt/pydeps {PKG}` (and markupsafe, its compiled dependency) "
              f"from a PEP 503 index in a network namespace of this bench; template agent-session; "
              f"a session imports it and finds the index blocked: {got}\n")
        print(f"| {'operation':<62} | {'n':>4} | {'p50 ms':>8} | {'p99 ms':>8} | {'vs base':>8} |")
        print(f"|{'-' * 64}|{'-' * 6}|{'-' * 10}|{'-' * 10}|{'-' * 10}|")
        row("baseline: hot start, environment that installed nothing", plain)
        row("hot start, environment with the packages installed", pkgs, plain)
        row("build, once: set-up `true`", [envs["plain"][1]])
        row("build, once: set-up pip install from the local index", [envs["pkgs"][1]])
        print(f"\nstarts served from a pool: {modes.count('pool')} of {len(modes)}")
        for eid, _ in envs.values():
            d.request("DELETE", f"/v1/environments/{eid}")
    finally:
        try:
            d.cleanup_sessions()
        finally:
            stop_index(srv, root, peer)


def stop_index(srv, root, peer):
    srv.terminate()
    srv.wait()
    peer.down()
    shutil.rmtree(root, ignore_errors=True)


def main():
    g = GitServer().start()
    m = ScriptedModel(SCRIPTS).start()
    only = os.environ.get("BENCH_ENV_ONLY", "")
    try:
        if only != "packages":
            starts_phase(m, g)
        if only != "starts":
            packages_phase(m, g)
    finally:
        m.stop()
        g.stop()


def starts_phase(m, g):
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


if __name__ == "__main__":
    main()
