"""Test harness: starts a real hatcheryd on its own port and data dir, talks
to it over HTTP, and checks that nothing of a sandbox is left on the host."""

import contextlib
import fcntl
import glob
import hashlib
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse
import weakref

import config_file

try:
    import pytest
except ImportError:  # a bench script, outside pytest
    pytest = None

# Daemons started and not yet stopped: a failing test's report gets their
# warnings and errors (a 503 only names a request id; its cause is in the
# log, which CI's output otherwise never shows).
LIVE = weakref.WeakSet()
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _makereport(item, call):
    """Imported by each suite's conftest.py: on a failure, the last
    warnings and errors of every live daemon go into the report."""
    outcome = yield
    rep = outcome.get_result()
    if rep.failed:
        for d in list(LIVE):
            bad = d.problem_lines(most=40)
            if bad:
                rep.sections.append((f"daemon {d.addr}:{d.port} warnings and errors", "\n".join(bad)))


if pytest:
    pytest_runtest_makereport = pytest.hookimpl(hookwrapper=True)(_makereport)


BIN_DIR = os.environ.get("HATCHERY_BIN_DIR", os.path.join(os.path.dirname(__file__), "../../target/release"))
TEMPLATES_DIR = os.environ.get("HATCHERY_TEMPLATES_DIR", "/var/lib/hatchery/templates")
# With a postgres:// URL here, every daemon a test starts without its own
# --db keeps its state on that server, in a database of its own and under
# a host id of its own (`make test-pg`: the suites against the PostgreSQL
# backend, each daemon as isolated as with its own SQLite file).
TEST_DB = os.environ.get("HATCHERY_TEST_DB", "")
# Read-only things tests share across daemons and across runs (docs/testing.md).
# Here: sealed template checkpoints, so a fresh daemon restores at once
# instead of baking its own (and its stop waiting for that bake).
CACHE = os.environ.get("HATCHERY_TEST_CACHE", "/var/cache/hatchery-test")


def own_database(prefix):
    """The daemon's database on the TEST_DB server, made on first use and
    named by its network prefix, which a restart keeps."""
    name = f"hx_{prefix}"
    r = subprocess.run(["psql", TEST_DB, "-qc", f"CREATE DATABASE {name}"], capture_output=True, text=True)
    if r.returncode != 0 and "already exists" not in r.stderr:
        raise RuntimeError(f"CREATE DATABASE {name}: {r.stderr.strip()}")
    return TEST_DB.rsplit("/", 1)[0] + "/" + name
KEY = "test-key-" + os.urandom(4).hex()


def _ephemeral_range():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
            return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_port():
    """A free port below the kernel's ephemeral range. A port the kernel
    handed out (bind to 0) can be handed out again, as the local end of any
    process's outgoing connection, while a daemon is between stop and
    start; one outside that range can only be taken by an explicit bind."""
    low, _ = _ephemeral_range()
    first = 20000 if low > 21000 else 1025
    for _ in range(200):
        port = random.randrange(first, low)
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
            return port
        except OSError:
            continue
        finally:
            s.close()
    raise RuntimeError(f"no free port in {first}..{low}")


def metric(d, name, labels=None):
    """The first sample of `name`, or the one with exactly `labels`
    (`k="v",...` as Prometheus prints them); 0 if there is none."""
    for line in d.request("GET", "/metrics").body.decode().splitlines():
        if labels is not None:
            if line.startswith(name + "{" + labels + "} "):
                return float(line.split()[-1])
        elif line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.split()[-1])
    return 0.0


def wait_for(cond, timeout=60, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def checkpoints_ready(d):
    """Whether every template the daemon serves has its checkpoint sealed
    and verified (baked by this daemon or seeded from the cache)."""
    r = d.request("GET", "/v1/templates")
    return r.status == 200 and all(t["checkpoint_ready"] for t in r.json()["templates"])


def wait_baked(d, timeout=120):
    """Waits until the daemon's template checkpoints are ready, seeded from
    the image cache or baked by the daemon at start; a bake counts once its
    builder sandbox is gone (the metric), so no builder is left running."""
    def done():
        if not checkpoints_ready(d):
            return False
        images = os.path.join(d.data_dir, "images")
        baked = [n for n in os.listdir(images) if n not in d.seeded] if os.path.isdir(images) else []
        return not baked or metric(d, "hatchery_template_images_baked_total") >= len(baked)
    wait_for(done, timeout=timeout, what="template checkpoints")


def _images_cache(templates_dir):
    """The image cache for daemons on `templates_dir`: a checkpoint names
    its template's rootfs path, so images are kept per templates directory.
    Image ids hash the template version and the agent and runsc builds
    (`Template::image_id`), so a stale image is simply never used."""
    key = hashlib.sha256(os.path.realpath(templates_dir).encode()).hexdigest()[:12]
    return os.path.join(CACHE, "images", key)


def _sealed(d):
    return os.path.isfile(os.path.join(d, "manifest.json"))


def _intact(d):
    """Every file of a sealed image matches its manifest (a test may have
    damaged it on purpose: such an image never goes into the cache)."""
    try:
        files = json.load(open(os.path.join(d, "manifest.json")))["files"]
        for name, want in files.items():
            h = hashlib.sha256()
            with open(os.path.join(d, name), "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            if h.hexdigest() != want["sha256"]:
                return False
        return True
    except (OSError, ValueError, KeyError, TypeError):
        return False


def seed_images(data_dir, templates_dir):
    """Copies the cached sealed checkpoints into a new daemon's images dir;
    returns their names. Copies, not links: a test may damage its daemon's
    image on purpose."""
    src = _images_cache(templates_dir)
    if not os.path.isdir(src):
        return set()
    names = set()
    with _cache_lock(src, fcntl.LOCK_SH):
        for name in os.listdir(src):
            if name.startswith(".") or not _sealed(os.path.join(src, name)):
                continue
            shutil.copytree(os.path.join(src, name), os.path.join(data_dir, "images", name))
            names.add(name)
    return names


def keep_images(data_dir, templates_dir):
    """Puts the sealed checkpoints a daemon baked into the cache
    (`_cache_put`), replacing older images of the same template."""
    src_dir = os.path.join(data_dir, "images")
    tmp_root = os.path.realpath(tempfile.gettempdir()) + os.sep
    # A templates dir of one test's own (under /tmp) is never seen again:
    # caching its images would only grow the cache run after run.
    if not os.path.isdir(src_dir) or os.path.realpath(templates_dir).startswith(tmp_root):
        return
    dst = _images_cache(templates_dir)
    for name in os.listdir(src_dir):
        src = os.path.join(src_dir, name)
        if not _sealed(src) or os.path.exists(os.path.join(dst, name)) or not _intact(src):
            continue
        template = name.rsplit("-", 1)[0]
        _cache_put(src, dst, name, lambda old: not old.startswith(".") and old.rsplit("-", 1)[0] == template)


@contextlib.contextmanager
def _cache_lock(d, how):
    """A cache directory's lock: readers copying entries out hold it
    shared, `_cache_put` exclusive while it renames in and removes
    superseded entries."""
    with open(os.path.join(d, ".lock"), "a") as f:
        fcntl.flock(f, how)
        yield


def _cache_put(src, dst, name, superseded):
    """Copies `src` into the cache as dst/name atomically (copied aside under
    dst, then renamed; a concurrent writer of the same name loses the
    rename, harmlessly), then removes the entries of dst it supersedes."""
    os.makedirs(dst, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".in-", dir=dst)
    try:
        subprocess.run(["cp", "-a", src, os.path.join(tmp, name)], check=True)
        # Not while a reader copies out of dst (the other lane's daemons):
        # an entry removed under it failed a test's set-up once.
        with _cache_lock(dst, fcntl.LOCK_EX):
            os.rename(os.path.join(tmp, name), os.path.join(dst, name))
            for old in os.listdir(dst):
                if old != name and superseded(old):
                    shutil.rmtree(os.path.join(dst, old), ignore_errors=True)
    except (OSError, subprocess.CalledProcessError):
        pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _net_items(prefix, netns=None):
    """(description, command that removes it) of each network namespace,
    veth and nftables table of a daemon with this prefix. `netns`: the
    namespace the daemon ran in (tests/pg/hostnet.py), where its veths and
    table were; the root namespace is checked too."""
    items = []
    if os.path.isdir("/run/netns"):
        items += [(f"netns {n}", ["ip", "netns", "delete", n])
                  for n in os.listdir("/run/netns") if n.startswith(f"hx{prefix}-")]
    inside = [[]]
    if netns and os.path.exists(f"/run/netns/{netns}"):
        inside.append(["ip", "netns", "exec", netns])
    for pre in inside:
        where = f" in {pre[3]}" if pre else ""
        links = subprocess.run([*pre, "ip", "-o", "link", "show"], capture_output=True, text=True).stdout
        for line in links.splitlines():
            name = line.split(": ")[1].split("@")[0]
            if name.startswith(f"hx{prefix}."):
                items.append((f"veth {name}{where}", [*pre, "ip", "link", "delete", name]))
        tables = subprocess.run([*pre, "nft", "list", "tables"], capture_output=True, text=True).stdout
        for line in tables.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[2] == f"hatchery_{prefix}":
                items.append((f"nftables table hatchery_{prefix}{where}", [*pre, "nft", "delete", "table", *parts[1:]]))
    return items


def net_leftovers(prefix, netns=None):
    """Network namespaces, veths and the nftables table of a daemon that
    is no longer running: all must be gone."""
    return [what for what, _ in _net_items(prefix, netns)]


def purge_net(prefix, netns=None):
    """Removes what net_leftovers finds, after a leak was reported, so one
    test's leak does not fail the tests after it (a later daemon's network
    checks would see stale namespaces and tables)."""
    for _, cmd in _net_items(prefix, netns):
        subprocess.run(cmd, capture_output=True)
    with contextlib.suppress(OSError):
        os.unlink(f"/run/hatchery/net-{prefix}.lock")


def seed_rootfs(templates_dir, name):
    """Copies the cached built root filesystems of template `name` into
    `templates_dir`, so a build of a spec with the same base and packages
    (the rootfs key) skips debootstrap. Only complete ones (`.complete`,
    written last by the build) are cached."""
    src = os.path.join(CACHE, "rootfs", name)
    if not os.path.isdir(src):
        return
    with _cache_lock(src, fcntl.LOCK_SH):
        for r in os.listdir(src):
            if r.startswith("rootfs-") and os.path.exists(os.path.join(src, r, ".complete")):
                os.makedirs(os.path.join(templates_dir, name), exist_ok=True)
                subprocess.run(["cp", "-a", os.path.join(src, r), os.path.join(templates_dir, name)], check=True)


def keep_rootfs(templates_dir, name):
    """Puts the complete root filesystems a test built for template `name`
    into the cache (`_cache_put`), replacing older ones."""
    dst = os.path.join(CACHE, "rootfs", name)
    for path in glob.glob(os.path.join(templates_dir, name, "rootfs-*")):
        r = os.path.basename(path)
        if not os.path.exists(os.path.join(path, ".complete")) or os.path.exists(os.path.join(dst, r)):
            continue
        _cache_put(path, dst, r, lambda old: old.startswith("rootfs-"))


REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def agent_templates():
    """The templates dir holding `agent-session` (templates/agent-session.json:
    curl, git, sudo, pip) that `make agent-template` keeps in the test cache
    (HATCHERY_AGENT_TEMPLATES_DIR), built here if missing or stale (a no-op
    when current). The lock beside the dir, which the Makefile's target
    takes too, keeps two lanes from running debootstrap into the same
    partial rootfs at once."""
    d = os.environ.get("HATCHERY_AGENT_TEMPLATES_DIR") or os.path.join(CACHE, "agent-templates")
    d = os.path.abspath(d)
    os.makedirs(d, exist_ok=True)
    with open(d + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        subprocess.run([os.path.join(BIN_DIR, "hatchery"), "template", "build-local", "--templates-dir", d,
                        os.path.join(REPO, "templates", "agent-session.json")], check=True, timeout=900)
    return d


def full_templates():
    """The templates dir holding `code-interpreter-full`'s rootfs
    (templates/code-interpreter-full.json: numpy, pandas, matplotlib,
    IPython, Node, TypeScript, R and a JDK from Debian) that `make full-template` keeps
    in the test cache (HATCHERY_FULL_TEMPLATES_DIR), built here if missing
    or stale, under the same kind of lock as agent_templates. A cold build
    is a debootstrap of about 200 packages (docs/e2b.md gives its time)."""
    d = os.environ.get("HATCHERY_FULL_TEMPLATES_DIR") or os.path.join(CACHE, "full-templates")
    d = os.path.abspath(d)
    os.makedirs(d, exist_ok=True)
    with open(d + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        subprocess.run([os.path.join(BIN_DIR, "hatchery"), "template", "build-local", "--templates-dir", d,
                        os.path.join(REPO, "templates", "code-interpreter-full.json")], check=True, timeout=1800)
    return d


def seed_cached_rootfs(templates_dir, spec, cache_dir):
    """Gives template `spec` the rootfs of the same template built in
    `cache_dir` (full_templates()), so a build through the API only runs
    its setup and bakes its checkpoint."""
    _copy_rootfs(os.path.join(cache_dir, spec["name"], f"rootfs-{rootfs_key(spec)}"), templates_dir, spec["name"])


def _copy_rootfs(src, templates_dir, name):
    """Copies a complete cached rootfs `src` into template `name`'s
    directory under `templates_dir`."""
    assert os.path.exists(os.path.join(src, ".complete")), src
    dst = os.path.join(templates_dir, name)
    os.makedirs(dst, exist_ok=True)
    subprocess.run(["cp", "-a", src, dst], check=True)


def rootfs_key(spec):
    """TemplateSpec::rootfs_key (crates/hatchery-templates/src/spec.rs):
    base, the packages with the implied ones, sorted and deduplicated, and
    the pip requirements when there are any."""
    pkgs = sorted(set(["python3", "procps", *spec.get("packages", [])]))
    key = f"{spec.get('base', 'debian-bookworm')}|{','.join(pkgs)}"
    if spec.get("pip"):
        key += "|pip:" + " ".join(spec["pip"])
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def seed_agent_rootfs(templates_dir, spec):
    """Gives template `spec` the agent template's rootfs, which it shares
    (same packages: templates/base.json and agent-session.json), so its
    build skips debootstrap. Fails if the keys differ: the two files have
    drifted apart."""
    agent = json.load(open(os.path.join(REPO, "templates", "agent-session.json")))
    key = rootfs_key(spec)
    assert rootfs_key(agent) == key, \
        f"template {spec['name']} and agent-session must list the same packages to share a rootfs"
    _copy_rootfs(os.path.join(agent_templates(), "agent-session", f"rootfs-{key}"), templates_dir, spec["name"])


class Response:
    def __init__(self, status, body, headers):
        self.status = status
        self.body = body
        self.headers = headers

    def json(self):
        return json.loads(self.body)

    def error_code(self):
        return self.json()["error"]["code"]

    def __repr__(self):
        return f"<{self.status} {self.body[:300]!r}>"


_seq = [0]


def net_args():
    """A network prefix and slot range of its own for each daemon, so
    daemons running side by side (and one started by `make run`) never share
    a netns name, an interface name or an address."""
    _seq[0] += 1
    n = (os.getpid() * 31 + _seq[0]) % (26 ** 4)
    letters = "".join(chr(ord("a") + (n // 26 ** i) % 26) for i in range(4))
    # Suites running side by side (tests/run_suites.py lanes) draw ranges
    # from disjoint halves, so two processes' daemons never share a /16.
    lane = int(os.environ.get("HATCHERY_TEST_LANE", "0")) % 2
    return ["--net-prefix", "t" + letters, "--net-range", f"10.{128 + lane * 50 + n % 50}.0.0/16"]


def arg(args, name):
    return args[args.index(name) + 1] if name in args else None


# Every daemon reads its settings from a file instead of flags.
CONFIG_FILE = os.environ.get("HATCHERY_TEST_CONFIG_FILE") == "1"


class Daemon:
    def __init__(self, extra_args=(), data_dir=None, templates_dir=None, netns=None, seed=True,
                 config_file=False):
        # Short path: unix socket paths are capped at 107 bytes.
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="hxt-", dir="/tmp")
        # A directory of its own goes when the daemon fails to start (no
        # cleanup() follows then); one passed in is the caller's.
        self.own_dir = data_dir is None
        self.port = free_port()
        # A network namespace of its own (tests/pg/hostnet.py HostNet): the
        # daemon runs in it and listens on its address.
        self.netns = netns
        self.addr = netns.addr if netns else "127.0.0.1"
        self.extra_args = list(extra_args)
        # Previews have a listener (an origin) of their own; the default,
        # the API's port + 1, could be another daemon's free_port().
        if "--preview-listen" in self.extra_args:
            self.preview_port = int(arg(self.extra_args, "--preview-listen").rsplit(":", 1)[1])
        else:
            self.preview_port = free_port()
            self.extra_args += ["--preview-listen", f"{self.addr}:{self.preview_port}"]
        if "--net-prefix" not in self.extra_args:
            self.extra_args += net_args()
        self.net_prefix = arg(self.extra_args, "--net-prefix")
        if TEST_DB and "--db" not in self.extra_args:
            self.extra_args += ["--db", own_database(self.net_prefix)]
            if "--host-id" not in self.extra_args:
                self.extra_args += ["--host-id", "h-" + self.net_prefix]
        self.proc = None
        self.log_path = os.path.join(self.data_dir, "daemon.log")
        self.created = set()
        self.templates_dir = templates_dir or TEMPLATES_DIR
        # seed=False: the daemon bakes its own checkpoints (tests of baking).
        self.seed = seed and not os.environ.get("HATCHERY_TEST_NO_IMAGE_CACHE")
        self.seeded = set()
        # config_file: the flags go into DATA_DIR/hatchery.toml, and the
        # daemon gets only --config (the file's keys are its flags' own).
        self.config_file = config_file or CONFIG_FILE

    def start(self):
        try:
            return self._start()
        except BaseException:
            self.stop()
            if self.own_dir and not os.environ.get("HATCHERY_KEEP_DATA"):
                shutil.rmtree(self.data_dir, ignore_errors=True)
            raise

    def _start(self):
        if self.seed and not os.path.exists(os.path.join(self.data_dir, "images")):
            self.seeded = seed_images(self.data_dir, self.templates_dir)
        env = dict(os.environ, HATCHERY_API_KEY=KEY, RUST_LOG="info")
        log = open(self.log_path, "ab")
        enter = ["nsenter", f"--net={self.netns.path}", "--"] if self.netns else []
        hatcheryd = os.path.join(BIN_DIR, "hatcheryd")
        args = ["--listen", f"{self.addr}:{self.port}", "--data-dir", self.data_dir,
                "--templates-dir", self.templates_dir, *self.extra_args]
        if self.config_file:
            args = ["--config", config_file.write(hatcheryd, args, os.path.join(self.data_dir, "hatchery.toml"))]
            # The settings come from the file alone: a variable would beat it.
            for var in config_file.variables(hatcheryd):
                env.pop(var, None)
        self.proc = subprocess.Popen([*enter, hatcheryd, *args], stdout=log, stderr=log, env=env)
        LIVE.add(self)
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                if self.request("GET", "/healthz", auth=False).status == 200:
                    return self
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited: {self.log()}")
            time.sleep(0.05)
        raise RuntimeError("daemon did not start: " + self.log())

    def log(self, tail=4000):
        """The daemon's log: its last `tail` characters (enough for an
        error message), or all of it with tail=None, which a test that
        looks for a line must use: a busy minute's log outgrows any tail."""
        try:
            text = open(self.log_path, errors="replace").read()
        except OSError:
            return ""
        return text if tail is None else text[-tail:]

    def crash(self):
        """SIGKILL: no graceful anything, like a crash."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def said_about(self, text, most=60):
        """The log's warnings and errors, and its lines naming a sandbox
        id that occurs in `text` (a leak check's report): its last `most`."""
        ids = set(re.findall(r"sbx_[a-z0-9]+", text))
        keep = self.problem_lines(ids, most)
        return "daemon log (warnings, errors, the leaked sandboxes):\n" + "\n".join(keep)

    def problem_lines(self, ids=(), most=40):
        """The log's last `most` warning and error lines (and lines naming
        one of `ids`), without colour codes."""
        lines = [ANSI.sub("", line)[:600] for line in self.log(tail=None).splitlines()]
        keep = [line for line in lines
                if " WARN " in line or " ERROR " in line or any(i in line for i in ids)]
        return keep[-most:]

    def stop(self):
        LIVE.discard(self)
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(40)
            except subprocess.TimeoutExpired:
                self.crash()

    def rss_kb(self):
        for line in open(f"/proc/{self.proc.pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def request(self, method, path, body=None, auth=True, headers=None, timeout=120, raw=None, port=None):
        conn = http.client.HTTPConnection(self.addr, port or self.port, timeout=timeout)
        h = dict(headers or {})
        if auth:
            h.setdefault("Authorization", f"Bearer {KEY}")
        data = raw
        if body is not None:
            data = json.dumps(body).encode()
            h.setdefault("Content-Type", "application/json")
        conn.request(method, path, body=data, headers=h)
        r = conn.getresponse()
        resp = Response(r.status, r.read(), dict(r.getheaders()))
        conn.close()
        return resp

    def preview(self, method, path, **kw):
        """A request to the preview listener (previews, E2B's relayed
        ports), without the key unless asked for."""
        kw.setdefault("auth", False)
        return self.request(method, path, port=self.preview_port, **kw)

    # Convenience wrappers -------------------------------------------------

    def create(self, **kw):
        r = self.request("POST", "/v1/sandboxes", kw)
        assert r.status == 201, r
        sid = r.json()["id"]
        self.created.add(sid)
        return sid

    def exec(self, sid, cmd=None, **kw):
        body = dict(kw)
        if cmd is not None:
            body["cmd"] = cmd
        r = self.request("POST", f"/v1/sandboxes/{sid}/exec", body)
        assert r.status == 200, r
        return r.json()

    def put_file(self, sid, path, data):
        return self.request("PUT", f"/v1/sandboxes/{sid}/files?path={urllib.parse.quote(path)}", raw=data)

    def get_file(self, sid, path):
        return self.request("GET", f"/v1/sandboxes/{sid}/files?path={urllib.parse.quote(path)}")

    def delete(self, sid):
        return self.request("DELETE", f"/v1/sandboxes/{sid}")

    def stream(self, sid, body, on_event=None, timeout=120, path=None, method="POST"):
        """Runs exec/stream (or another SSE endpoint); returns the list of
        (event, data) pairs."""
        conn = http.client.HTTPConnection(self.addr, self.port, timeout=timeout)
        conn.request(method, path or f"/v1/sandboxes/{sid}/exec/stream",
                     body=json.dumps(body) if body is not None else None,
                     headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200, r.read()
        events, event, data = [], None, []
        while True:
            line = r.readline()
            if not line:
                break
            line = line.decode().rstrip("\n")
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip())
            elif line == "" and event:
                ev = (event, json.loads("\n".join(data)))
                events.append(ev)
                if on_event and on_event(ev) is False:
                    conn.close()
                    return events
                event, data = None, []
        conn.close()
        return events

    # Leak checks ----------------------------------------------------------

    def leftovers(self, net=True):
        """Everything on the host that still belongs to this daemon's
        sandboxes: processes, cgroups, mounts, state directories, and once
        the daemon is gone, its network slots and nftables table."""
        left = []
        me = os.getpid()
        daemon_pid = self.proc.pid if self.proc and self.proc.poll() is None else None
        for p in glob.glob("/proc/[0-9]*/cmdline"):
            pid = int(p.split("/")[2])
            if pid in (me, daemon_pid):
                continue
            try:
                cmd = open(p, "rb").read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if self.data_dir in cmd or any(s in cmd for s in self.created):
                left.append(f"process {pid}: {cmd[:120]}")
        for sid in self.created:
            for c in glob.glob(f"/sys/fs/cgroup/*/{sid}"):
                left.append(f"cgroup {c}")
        for sub in ("sandboxes", "runsc"):
            d = os.path.join(self.data_dir, sub)
            if os.path.isdir(d) and os.listdir(d):
                left.append(f"state {d}: {os.listdir(d)}")
        for line in open("/proc/self/mountinfo"):
            if self.data_dir in line or any(s in line for s in self.created):
                left.append(f"mount {line.strip()}")
        if daemon_pid is None and net:
            left += net_leftovers(self.net_prefix, self.netns.name if self.netns else None)
        return left

    def purge_leftovers(self):
        """After a reported leak: kill this daemon's sandbox processes and
        remove its mounts and network, so the leak fails only its own test."""
        # A parked (frozen) pooled sandbox dies of SIGKILL only once thawed
        # (hatchery-runtime-gvisor's freezer.rs).
        try:
            mine = set(os.listdir(os.path.join(self.data_dir, "sandboxes"))) | set(self.created)
        except OSError:
            mine = set(self.created)
        for sid in mine:
            try:
                with open(f"/sys/fs/cgroup/freezer/{sid}/freezer.state", "w") as f:
                    f.write("THAWED")
            except OSError:
                pass
        me = os.getpid()
        for p in glob.glob("/proc/[0-9]*/cmdline"):
            pid = int(p.split("/")[2])
            try:
                cmd = open(p, "rb").read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if pid != me and (self.data_dir in cmd or any(s in cmd for s in self.created)):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        time.sleep(0.5)
        for line in reversed(open("/proc/self/mountinfo").readlines()):
            mnt = line.split()[4]
            if self.data_dir in mnt:
                subprocess.run(["umount", "-l", mnt], capture_output=True)
        purge_net(self.net_prefix, self.netns.name if self.netns else None)

    # Under load (two lanes on two cores) runsc teardown of a sandbox can
    # take well over 20 s; the wait is bounded all the same.
    def wait_no_leftovers(self, timeout=60, net=True):
        deadline = time.time() + timeout
        while time.time() < deadline:
            left = self.leftovers(net)
            if not left:
                return
            time.sleep(0.2)
        raise AssertionError(f"leaked after {timeout}s: {left}")

    def _delete_sandboxes(self):
        r = self.request("GET", "/v1/sandboxes")
        assert r.status == 200, r
        for s in r.json()["sandboxes"]:
            self.created.add(s["id"])
            if TEST_DB:
                # On a shared store the list may be every host's: delete
                # here only what this daemon runs (marked as forwarded,
                # never sent on).
                r = self.request("DELETE", f"/v1/sandboxes/{s['id']}",
                                 headers={"X-Hatchery-Forwarded-By": "harness-cleanup"})
            else:
                r = self.delete(s["id"])
            assert r.status in (204, 404), r

    def reset(self):
        """Between two tests that share this daemon: it must have survived
        the first; every sandbox and snapshot goes, and nothing of them may
        be left on the host, as if the daemon were new."""
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(f"the shared daemon died during the test: {self.log()}")
        self._delete_sandboxes()
        r = self.request("GET", "/v1/snapshots")
        assert r.status == 200, r
        for s in r.json()["snapshots"]:
            assert self.request("DELETE", f"/v1/snapshots/{s['id']}").status in (204, 404)
        self.wait_no_leftovers(net=False)
        self.created.clear()

    def cleanup(self):
        """Delete every sandbox, verify nothing is left, stop, remove."""
        try:
            if self.proc and self.proc.poll() is None:
                try:
                    self._delete_sandboxes()
                except AssertionError:
                    pass  # the leak check below says what is left
            # A graceful stop also destroys the warm pool.
            self.stop()
            try:
                self.wait_no_leftovers()
            except AssertionError as e:
                self.purge_leftovers()
                # The daemon is stopped and its data dir goes below: what
                # it said about the leaked sandboxes goes with the failure.
                raise AssertionError(f"{e}\n{self.said_about(str(e))}") from None
        finally:
            self.stop()
            if self.netns:
                self.netns.delete()
            if self.seed:
                keep_images(self.data_dir, self.templates_dir)
            if not os.environ.get("HATCHERY_KEEP_DATA"):
                shutil.rmtree(self.data_dir, ignore_errors=True)
