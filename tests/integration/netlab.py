"""A fake internet on this machine: a network namespace the test creates,
holding a "public" host (198.51.100.7 and .8), a "metadata" endpoint
(169.254.169.254) and a "private" service (10.99.0.10), all served by one
small server inside that namespace and routed from the host through a veth.
Nothing is ever sent anywhere else; everything is removed afterwards."""

import ctypes
import os
import shlex
import subprocess
import sys
import threading
import time

NS = "hxtinet"
HOST_IF, NS_IF = "hxtinr", "hxtinn"
LINK_HOST, LINK_NS = "198.18.0.1", "198.18.0.2"
PUBLIC, PUBLIC2 = "198.51.100.7", "198.51.100.8"
METADATA = "169.254.169.254"
PRIVATE = "10.99.0.10"
TARGETS = [PUBLIC, PUBLIC2, METADATA, PRIVATE]

SERVER = r'''
import socket, socketserver, threading
class Http(socketserver.BaseRequestHandler):
    def handle(self):
        self.request.settimeout(5)
        try: self.request.recv(1024)
        except OSError: pass
        me = self.request.getsockname()
        self.request.sendall(b"HTTP/1.0 200 OK\r\n\r\nhello from %s:%d\n" % (me[0].encode(), me[1]))
class Echo(socketserver.BaseRequestHandler):
    def handle(self):
        self.request.settimeout(60)
        while True:
            try: d = self.request.recv(1024)
            except OSError: return
            if not d: return
            self.request.sendall(d)
class T(socketserver.ThreadingMixIn, socketserver.TCPServer):
    allow_reuse_address = True; daemon_threads = True
for port, h in ((80, Http), (8080, Http), (7, Echo)):
    threading.Thread(target=T(("0.0.0.0", port), h).serve_forever, daemon=True).start()
def udp(addr):
    # Bound per address so replies leave from the address that was asked.
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind((addr, 9999))
    while True:
        d, a = u.recvfrom(1024); u.sendto(b"udp-ok " + d, a)
for addr in ADDRS:
    threading.Thread(target=udp, args=(addr,), daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
'''


def sh(*cmd, check=True):
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def veth_ns(ns, host_if, ns_if, host_cidr, ns_cidrs):
    """A namespace `ns` at the far end of a veth from the host: `host_cidr`
    on the host's end, `ns_cidrs` on its own, its loopback up and its
    default route back through the host. Half-built pieces are the
    caller's to remove (veth_ns_down) when a step fails."""
    sh("ip", "netns", "add", ns)
    sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if, "netns", ns)
    sh("ip", "addr", "add", host_cidr, "dev", host_if)
    sh("ip", "link", "set", host_if, "up")
    for c in ns_cidrs:
        sh("ip", "-n", ns, "addr", "add", c, "dev", ns_if)
    sh("ip", "-n", ns, "link", "set", ns_if, "up")
    sh("ip", "-n", ns, "link", "set", "lo", "up")
    sh("ip", "-n", ns, "route", "add", "default", "via", host_cidr.split("/")[0])


def veth_ns_down(ns, host_if, routes=()):
    """Removes what veth_ns (and `routes`, /32s added in the root namespace)
    made; whatever is already gone is skipped."""
    for a in routes:
        sh("ip", "route", "del", f"{a}/32", check=False)
    sh("ip", "link", "del", host_if, check=False)
    sh("ip", "netns", "del", ns, check=False)


def ns_up(ns, host_if, ns_if, host_addr, ns_addr, addrs):
    """A namespace at the far end of a veth /30 from the host, its default
    route back through the host, and SERVER answering on `addrs`; returns
    the server process (ready)."""
    veth_ns(ns, host_if, ns_if, f"{host_addr}/30", [f"{ns_addr}/30"])
    for a in addrs:
        if a != ns_addr:
            sh("ip", "-n", ns, "addr", "add", f"{a}/32", "dev", "lo")
            sh("ip", "route", "add", f"{a}/32", "via", ns_addr)
    server = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", f"ADDRS = {addrs!r}\n" + SERVER],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert server.stdout.readline().strip() == "ready"
    return server


def ns_down(server, ns, host_if, addrs):
    if server:
        server.kill()
        server.wait()
    veth_ns_down(ns, host_if, addrs)


_libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNET = 0x40000000


class TestNet:
    """A network namespace of the test's own at the far end of a veth, with
    `addrs` on its side of one small subnet (`host_addr/prefix_len` on the
    host's): the host reaches every address through that link's connected
    route, so nothing else is routed in the root namespace. Servers of the
    test process listen there through `call`, which runs a function (say,
    one that binds a socket) in a thread that has entered the namespace:
    a socket stays in the namespace it was made in, so the server's threads
    and state stay in the test process, where the test reads them."""

    __test__ = False  # not a pytest test class, despite the name

    def __init__(self, ns, host_if, ns_if, host_addr, addrs, prefix_len):
        self.ns, self.host_if, self.ns_if = ns, host_if, ns_if
        self.host_addr, self.addrs, self.prefix_len = host_addr, list(addrs), prefix_len

    def up(self):
        self.down()  # a run killed before its teardown left these behind
        try:
            veth_ns(self.ns, self.host_if, self.ns_if, f"{self.host_addr}/{self.prefix_len}",
                    [f"{a}/{self.prefix_len}" for a in self.addrs])
        except BaseException:
            self.down()
            raise
        return self

    def down(self):
        veth_ns_down(self.ns, self.host_if)

    def left(self):
        """What of this namespace is still on the host (empty once down)."""
        out = []
        if os.path.exists(f"/run/netns/{self.ns}"):
            out.append(f"netns {self.ns}")
        if sh("ip", "link", "show", self.host_if, check=False).returncode == 0:
            out.append(f"link {self.host_if}")
        return out

    def argv(self, *cmd):
        """`cmd` run inside the namespace."""
        return ["ip", "netns", "exec", self.ns, *cmd]

    def call(self, fn):
        """fn() in a thread inside the namespace; its result (or exception)."""
        box = {}

        def run():
            try:
                with open(f"/run/netns/{self.ns}") as f:
                    if _libc.setns(f.fileno(), CLONE_NEWNET) != 0:
                        e = ctypes.get_errno()
                        raise OSError(e, f"setns {self.ns}: {os.strerror(e)}")
                box["ok"] = fn()
            except BaseException as e:  # handed to the caller's thread
                box["err"] = e
        t = threading.Thread(target=run)
        t.start()
        t.join()
        if "err" in box:
            raise box["err"]
        return box["ok"]


class NetLab:
    def __init__(self):
        self.server = None

    def up(self):
        self.down()
        self.server = ns_up(NS, HOST_IF, NS_IF, LINK_HOST, LINK_NS, TARGETS)
        return self

    def down(self):
        ns_down(self.server, NS, HOST_IF, TARGETS)
        self.server = None


class Peer:
    """One HTTP server (port 80) in a network namespace of its own, at the
    far end of a veth /30 from the host: a destination a sandbox could reach
    if its policy let it, for suites that only need "can this sandbox
    connect out?" answered with a real connection. Unlike NetLab it routes
    nothing in the root namespace, and its names and addresses are per
    process and per lane (198.19.0.0/16, RFC 2544's benchmarking range), so
    suites in both lanes of `make test` can each have one."""

    def __init__(self):
        lane = int(os.environ.get("HATCHERY_TEST_LANE", "0")) % 2
        n = os.getpid() % 64
        self.ns = f"hxtpeer{lane}x{n}"
        self.host_if, self.ns_if = f"hxtp{lane}x{n}r", f"hxtp{lane}x{n}n"
        base = 4 * n
        self.host_addr = f"198.19.{lane}.{base + 1}"
        self.addr = f"198.19.{lane}.{base + 2}"
        self.server = None

    def up(self):
        self.down()
        self.server = ns_up(self.ns, self.host_if, self.ns_if, self.host_addr, self.addr, [self.addr])
        return self

    def down(self):
        ns_down(self.server, self.ns, self.host_if, [])
        self.server = None


# Runs inside the sandbox: one probe per line of argv, JSON out.
PROBE = r'''
import json, socket, sys, time
def tcp(h, p):
    s = socket.socket(); s.settimeout(3)
    try:
        s.connect((h, p)); s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        return "open:" + s.recv(200).decode(errors="replace").split("\r\n\r\n")[-1].strip()
    except Exception as e:
        return "blocked:" + type(e).__name__
    finally:
        s.close()
def udp(h, p):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2)
    try:
        s.sendto(b"x", (h, p)); return "open:" + s.recv(100).decode()
    except Exception as e:
        return "blocked:" + type(e).__name__
def icmp(h, p):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP); s.settimeout(2)
    try:
        s.sendto(b"\x08\x00\x00\x00\x00\x01\x00\x01hatchery", (h, 0)); s.recv(100); return "open:pong"
    except Exception as e:
        return "blocked:" + type(e).__name__
def tcp6(h, p):
    s = socket.socket(socket.AF_INET6); s.settimeout(3)
    try:
        s.connect((h, p)); return "open:"
    except OSError as e:
        # The errno says why: no route at all (ENETUNREACH) is a different
        # promise from a drop on the host (a timeout).
        return "blocked:" + type(e).__name__ + ":" + str(e.errno)
out = {}
for spec in sys.argv[1:]:
    kind, h, p = spec.split(",")
    out[spec] = globals()[kind](h, int(p))
print(json.dumps(out))
'''


def probe_cmd(*specs):
    """PROBE as one shell command (for set-up commands and plain execs):
    prints its JSON, one result per spec ("kind,host,port")."""
    return shlex.join(["python3", "-c", PROBE, *specs])
