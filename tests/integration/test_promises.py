"""Promises of docs/threat-model.md that had no test (issue 30): hostile
frames on the agent channel, the caps on guest error messages and directory
listings, the agent's stderr, the global connection cap. Each test is
bounded (socket and exec timeouts) and says what it holds and how it fails."""

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time

import pytest

from harness import BIN_DIR, Daemon, metric, net_args, wait_for

# One daemon for the module's tests (tests/integration/conftest.py).
SHARED_DAEMON = True

# The guest writes raw bytes into the agent's stdout (its channel to the
# host), as root guest code can: the threat model's "through /proc/1/fd".
WRITE_CHANNEL = ("python3 -c \"import os,sys; fd=os.open('/proc/1/fd/1', os.O_WRONLY);"
                 " os.write(fd, bytes.fromhex(sys.argv[1])); print('written')\" {hex}")


def frame(channel, kind, payload=b""):
    body = struct.pack(">IB", channel, kind) + payload
    return struct.pack(">I", len(body)) + body


def killed(d):
    return metric(d, "hatchery_sandboxes_killed_total", 'reason="guest_exited"')


def forge(d, sid, raw):
    """Runs the writer in `sid`; the answer may never come (the channel is
    what it breaks), so only the status is returned."""
    r = d.request("POST", f"/v1/sandboxes/{sid}/exec",
                  {"cmd": WRITE_CHANNEL.format(hex=raw.hex()), "timeout_seconds": 10}, timeout=20)
    return r


# 1. Hostile frames on the agent channel -----------------------------------

@pytest.mark.parametrize("what,raw", [
    # A request kind (Exec = 1) coming from the guest: the daemon's reader refuses it.
    ("host-direction kind", frame(0x12345, 1, b"{}")),
    # A length prefix over MAX_FRAME (1 MiB): the shim's reader refuses it before allocating.
    ("oversized length", struct.pack(">I", (1 << 20) + 1) + b"\0" * 16),
    # A kind nobody defines.
    ("unknown kind", frame(0x12345, 250, b"x")),
    # A length under the 5-byte header.
    ("short frame", struct.pack(">I", 2) + b"\0\0"),
], ids=["host-direction-kind", "oversized-length", "unknown-kind", "short-frame"])
def test_a_hostile_frame_ends_its_sandbox_and_nothing_else(daemon, what, raw):
    # Promise: a guest that breaks the channel's framing loses its own sandbox, the daemon and
    # other sandboxes go on. Fails if the frame is accepted (the victim still answers) or if the
    # daemon or the bystander is hurt.
    bystander = daemon.create(ttl_seconds=120)
    victim = daemon.create(ttl_seconds=120)
    before = killed(daemon)
    r = forge(daemon, victim, raw)
    assert r.status in (200, 504), r
    wait_for(lambda: daemon.request("GET", f"/v1/sandboxes/{victim}").status == 404,
             timeout=10, what=f"the victim of a {what} to be stopped")
    assert killed(daemon) == before + 1
    assert daemon.proc.poll() is None, "the daemon died"
    assert daemon.request("GET", "/healthz", auth=False).status == 200
    assert daemon.exec(bystander, "echo alive", timeout_seconds=10)["stdout"] == "alive\n"
    fresh = daemon.create(ttl_seconds=60)
    assert daemon.exec(fresh, "echo fresh", timeout_seconds=10)["stdout"] == "fresh\n"


def test_a_forged_reply_for_a_channel_nobody_opened_is_dropped(daemon, sandbox):
    # Promise: a well-formed guest->host frame for a channel no request holds is dropped and the
    # sandbox keeps serving. Fails if such a frame broke the connection (the exec after it 504s)
    # or landed in another request's answer.
    forged = frame(0x7ffffff0, 101, b"FORGED-STDOUT") + frame(0x7ffffff1, 103, b'{"exit_code":7}')
    r = forge(daemon, sandbox, forged)
    assert r.status == 200 and r.json()["stdout"] == "written\n", r
    r = daemon.exec(sandbox, "echo still-here", timeout_seconds=10)
    assert r["stdout"] == "still-here\n" and r["exit_code"] == 0 and "FORGED" not in json.dumps(r), r
    assert daemon.request("GET", f"/v1/sandboxes/{sandbox}").status == 200


# 2. Caps on what the guest sends back ----------------------------------------

def test_a_guest_error_message_is_cut_at_512_characters(daemon, sandbox):
    # Promise: a guest error message reaches the caller cut at 512 characters. Fails if the whole
    # (longer) message comes through, or if it is cut shorter.
    dirs = "/tmp/" + "/".join(c * 200 for c in "abc")
    path = dirs + "/fifo"
    r = daemon.exec(sandbox, f"mkdir -p {dirs} && mkfifo {path} && echo ok", timeout_seconds=10)
    assert r["stdout"] == "ok\n", r
    full = f"{path} is a FIFO; only regular files can be read or written"
    assert len(full) > 600
    r = daemon.get_file(sandbox, path)
    assert r.status == 400 and r.error_code() == "not_a_regular_file", r
    message = r.json()["error"]["message"]
    prefix = "guest error (not_a_regular_file): "
    assert message.startswith(prefix), message
    assert message[len(prefix):] == full[:512]


@pytest.mark.parametrize("count,listed", [(10_000, 10_000), (10_001, 10_000)], ids=["10000", "10001"])
def test_a_directory_listing_is_cut_at_10000_entries(daemon, sandbox, count, listed):
    # Promise: a listing holds at most 10,000 entries: exactly 10,000 all come back, one more is
    # cut. Fails if the cap is off by one either way or missing.
    r = daemon.exec(sandbox, f"python3 -c \"import os; os.mkdir('/tmp/many');"
                             f" [open('/tmp/many/f%05d' % i, 'w').close() for i in range({count})];"
                             f" print(len(os.listdir('/tmp/many')))\"", timeout_seconds=30)
    assert r["stdout"] == f"{count}\n", r
    r = daemon.request("GET", f"/v1/sandboxes/{sandbox}/files/list?path=/tmp/many", timeout=30)
    assert r.status == 200, r
    names = [e["name"] for e in r.json()["entries"]]
    assert len(names) == listed and len(set(names)) == listed
    if count == listed:
        assert set(names) == {"f%05d" % i for i in range(count)}


# 3. The agent's stderr --------------------------------------------------------

def test_the_agents_stderr_is_out_of_the_guests_reach(daemon, sandbox):
    # Promise: the agent (PID 1) points its stderr at /dev/null, so guest code can neither read
    # it nor write into the host's runsc.log through /proc/1/fd/2. Fails if fd 2 is anything else
    # or if the guest's marker shows up in any file of the daemon's data dir.
    bundle = os.path.join(daemon.data_dir, "sandboxes", sandbox)
    assert os.path.isfile(os.path.join(bundle, "runsc.log")), os.listdir(bundle)
    # Made in the guest, so the command's own text (which the daemon may log) never holds it.
    r = daemon.exec(sandbox, "m=STDERR-MARK-$((6*7))-$$; readlink /proc/1/fd/2;"
                             " for i in 1 2 3; do echo $m > /proc/1/fd/2; done; echo $m;"
                             " cat /proc/1/fd/2 | wc -c", timeout_seconds=10)
    target, marker, readable = r["stdout"].split("\n")[:3]
    assert target == "/dev/null", r
    assert marker.startswith("STDERR-MARK-42-") and readable == "0", r
    time.sleep(0.5)
    hits = []
    for root, dirs, files in os.walk(daemon.data_dir):
        # Template checkpoints: copied in before the sandbox existed, and large.
        dirs[:] = [d for d in dirs if not (root == daemon.data_dir and d == "images")]
        for f in files:
            p = os.path.join(root, f)
            try:
                with open(p, "rb") as fh:
                    if marker.encode() in fh.read(64 << 20):
                        hits.append(p)
            except OSError:
                pass
    assert not hits, hits
    assert daemon.exec(sandbox, "echo ok", timeout_seconds=10)["stdout"] == "ok\n"


# 5. The global connection cap ---------------------------------------------------

def test_the_global_connection_cap_is_reached_across_peers():
    # Promise: --http-max-connections caps connections from all peers together (503 "capacity",
    # "too many open connections"), and places come back when they close. Fails if the cap is
    # only per peer (three addresses each under their own cap would all be let in).
    d = Daemon(extra_args=["--pool-size", "0", "--http-max-connections", "6",
                           "--http-max-connections-per-peer", "100"]).start()
    socks = []

    def connect(src):
        s = socket.socket()
        s.settimeout(5)
        s.bind((src, 0))
        s.connect(("127.0.0.1", d.port))
        return s

    def ask(src):
        s = connect(src)
        try:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = b""
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
            return data
        finally:
            s.close()

    try:
        # Let the start-up health checks' connections be seen closed.
        wait_for(lambda: b" 200 " in ask("127.0.0.1").split(b"\r\n")[0], timeout=5, what="a first answer")
        time.sleep(0.3)
        # Six held connections from two addresses, each one idle but admitted
        # (an admitted connection gets no 503 to read).
        for src in ["127.0.0.2"] * 3 + ["127.0.0.3"] * 3:
            socks.append(connect(src))
        time.sleep(0.3)
        for s in socks:
            s.setblocking(False)
            try:
                assert s.recv(1) == b"", "a held connection was refused"
            except BlockingIOError:
                pass
            s.setblocking(True)
        # The seventh, from an address with none open, is over the global cap.
        head, _, body = ask("127.0.0.4").partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503"), head
        err = json.loads(body)["error"]
        assert err == {"code": "capacity", "message": "too many open connections"}, err
        # Closing one gives its place back.
        socks.pop().close()
        wait_for(lambda: b" 200 " in ask("127.0.0.4").split(b"\r\n")[0], timeout=5,
                 what="a place to come back")
    finally:
        for s in socks:
            s.close()
        d.cleanup()


# 7. ip_forward: the first daemon turns it on, the last one puts it back ----------

class Isolated:
    """A network namespace and a private mount namespace with tmpfs over
    /run/hatchery and /run/netns, held by a sleeping process: daemons
    started in it change ip_forward, /run/hatchery and make their slots'
    namespaces only there, so neither the host's ip_forward nor the
    daemons running beside this test are touched, and nothing is left on
    the host even if a daemon here dies."""

    def __init__(self):
        self.holder = subprocess.Popen(
            ["unshare", "--net", "--mount", "--propagation", "private", "--", "sh", "-c",
             "ip link set lo up && mount -t tmpfs -o size=1m tmpfs /run/hatchery"
             " && mkdir -p /run/netns && mount -t tmpfs -o size=1m tmpfs /run/netns"
             " && echo 0 > /proc/sys/net/ipv4/ip_forward && echo up && exec sleep 120"],
            stdout=subprocess.PIPE, text=True)
        assert self.holder.stdout.readline().strip() == "up"
        self.enter = ["nsenter", "-t", str(self.holder.pid), "--net", "--mount", "--"]

    def run(self, *cmd):
        return subprocess.run([*self.enter, *cmd], capture_output=True, text=True, timeout=10).stdout

    def ip_forward(self):
        return self.run("cat", "/proc/sys/net/ipv4/ip_forward").strip()

    def close(self):
        self.holder.kill()
        self.holder.wait()


class InnerDaemon:
    """A bare hatcheryd in an Isolated namespace, no templates (nothing to
    bake or restore), reached only by its log."""

    def __init__(self, ns):
        self.ns = ns
        self.data_dir = tempfile.mkdtemp(prefix="hxt-fw-", dir="/tmp")
        self.templates = os.path.join(self.data_dir, "no-templates")
        os.makedirs(self.templates)
        self.log_path = os.path.join(self.data_dir, "daemon.log")
        self.proc = subprocess.Popen(
            [*ns.enter, os.path.join(BIN_DIR, "hatcheryd"), "--listen", "127.0.0.1:0",
             "--data-dir", os.path.join(self.data_dir, "d"), "--templates-dir", self.templates,
             "--pool-size", "0", *net_args()],
            stdout=open(self.log_path, "ab"), stderr=subprocess.STDOUT,
            env=dict(os.environ, HATCHERY_API_KEY="k" * 32, RUST_LOG="info"))
        wait_for(lambda: "hatcheryd ready" in self.log() or self.proc.poll() is not None,
                 timeout=30, what="an inner daemon")
        assert self.proc.poll() is None, self.log()

    def log(self):
        return open(self.log_path, errors="replace").read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)
        return self.proc.returncode

    def remove(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.data_dir, ignore_errors=True)


def test_ip_forward_is_put_back_by_the_last_daemon_to_stop():
    # Promise (hatchery-net host.rs): the first daemon turns ip_forward on, another daemon still
    # running keeps it on when one stops, and the last clean stop puts the old value back. Fails
    # if a stop restores it under a live daemon, or if the last stop leaves it on.
    ns = Isolated()
    daemons = []
    try:
        # What makes this safe to run beside other daemons: its own network and mount namespaces
        # (the host's ip_forward itself is not compared: daemons run beside it may change it).
        for kind in ("net", "mnt"):
            assert os.readlink(f"/proc/{ns.holder.pid}/ns/{kind}") != os.readlink(f"/proc/self/ns/{kind}")
        assert ns.ip_forward() == "0"
        daemons.append(InnerDaemon(ns))
        assert ns.ip_forward() == "1"
        # Saved per network namespace (hatchery-net host.rs), named by its inode.
        netns_id = "".join(c for c in os.readlink(f"/proc/{ns.holder.pid}/ns/net") if c.isdigit())
        assert ns.run("cat", f"/run/hatchery/ip_forward.{netns_id}.orig").strip() == "0"
        daemons.append(InnerDaemon(ns))
        assert ns.ip_forward() == "1"
        assert daemons[0].stop() == 0
        assert ns.ip_forward() == "1", "restored while another daemon runs"
        assert daemons[1].stop() == 0
        assert ns.ip_forward() == "0", "the last daemon left forwarding on"
        assert ns.run("ls", "/run/hatchery") == ""
        # A host that forwarded before keeps forwarding.
        ns.run("sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward")
        daemons.append(InnerDaemon(ns))
        assert daemons[2].stop() == 0
        assert ns.ip_forward() == "1"
    finally:
        for d in daemons:
            d.remove()
        ns.close()
