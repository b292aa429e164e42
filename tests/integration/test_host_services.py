"""Host services: code inside every sandbox reaches a host-side service at
127.0.0.1:GUEST_PORT in the guest; the agent relays each connection over
its channel, the daemon connects to the service and attaches the
sandbox's identity (an X-Hatchery-Sandbox header, or a PROXY protocol v1
line), which guest code cannot forge. The sandbox keeps no route to the
host; listeners work in pooled (restored) sandboxes, forks and after a
daemon restart."""

import hashlib
import json
import os
import socket
import socketserver
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from guest_servers import wait_relays_closed
from harness import Daemon, arg, metric, wait_baked, wait_for


class EchoHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, *a):
        pass

    def do_GET(self):
        if self.path.startswith("/big/"):
            n = int(self.path.split("/")[2])
            self.send_response(200)
            self.send_header("Content-Length", str(n))
            self.end_headers()
            self.wfile.write(b"z" * n)
            return
        self._echo(b"")

    def do_POST(self):
        self._echo(self.rfile.read(int(self.headers.get("Content-Length") or 0)))

    def _echo(self, body):
        out = json.dumps({"path": self.path, "headers": [[k.lower(), v] for k, v in self.headers.items()],
                          "body_sha256": hashlib.sha256(body).hexdigest()}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


class Raw(socketserver.BaseRequestHandler):
    """Reads the PROXY line, answers `line|data` for every chunk after."""

    def handle(self):
        self.server.accepted += 1
        f = self.request.makefile("rb")
        line = f.readline().decode().rstrip("\r\n")
        self.request.sendall(f"hello {line}\n".encode())
        while True:
            d = f.readline()
            if not d:
                return
            self.request.sendall(b"echo " + d)


# socketserver's default listen backlog is 5: the cap test opens 64
# upstream connections at once, and on a busy machine SYNs past the backlog
# are dropped and retried (1 s, 2 s, 4 s) until the relay's 5 s connect
# timeout gives one up; that was its rare 63 of 64. A real backlog.
BACKLOG = 256


class UnixRaw(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    request_queue_size = BACKLOG
    accepted = 0


class TcpRaw(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = BACKLOG
    accepted = 0


@pytest.fixture(scope="module")
def services():
    http_srv = ThreadingHTTPServer(("127.0.0.1", 0), EchoHandler)
    http_srv.daemon_threads = True
    sock_dir = tempfile.mkdtemp(prefix="hxhs-", dir="/tmp")
    sock = os.path.join(sock_dir, "raw.sock")
    unix_srv = UnixRaw(sock, Raw)
    tcp_srv = TcpRaw(("127.0.0.1", 0), Raw)
    for s in (http_srv, unix_srv, tcp_srv):
        threading.Thread(target=s.serve_forever, daemon=True).start()
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    dead_port = dead.getsockname()[1]
    dead.close()
    yield {"http": http_srv.server_address[1], "unix": sock, "tcp": tcp_srv.server_address[1],
           "tcp_srv": tcp_srv, "dead": dead_port}
    for s in (http_srv, unix_srv, tcp_srv):
        s.shutdown()
        s.server_close()
    os.unlink(sock)
    os.rmdir(sock_dir)


def flags(s):
    return ["--host-service", f"echo=9100=127.0.0.1:{s['http']}",
            "--host-service", f"raw=9101=unix:{s['unix']},identity=proxy",
            "--host-service", f"tcpraw=9102=127.0.0.1:{s['tcp']},identity=proxy",
            "--host-service", f"down=9103=127.0.0.1:{s['dead']}"]


@pytest.fixture
def hsd(services):
    d = Daemon(extra_args=["--pool-size", "0", *flags(services)]).start()
    yield d
    d.cleanup()


# Runs in the guest: three requests on one kept-alive connection, each with a
# forged identity (one also naming it in Connection), a POST, a big answer, and the unreachable service.
HTTP_CLIENT = r'''
import hashlib, http.client, json
out = {}
c = http.client.HTTPConnection("127.0.0.1", 9100, timeout=20)
c.putrequest("GET", "/first?x=1")
c.putheader("X-Hatchery-Sandbox", "sbx_forged0000000000")
c.putheader("x-hatchery-sandbox", "sbx_forged1111111111")
c.endheaders()
r = c.getresponse(); out["first"] = json.loads(r.read())
body = b"p" * 300000
c.request("POST", "/second", body=body, headers={"X-HATCHERY-SANDBOX": "sbx_forged2222222222"})
r = c.getresponse(); out["second"] = json.loads(r.read()); out["sent_sha"] = hashlib.sha256(body).hexdigest()
# Naming the identity header as hop-by-hop must not strip it (issue 31,
# finding 4): the relay adds it after the hop-by-hop headers are gone.
c.request("GET", "/third", headers={"Connection": "x-hatchery-sandbox, keep-alive",
                                     "X-Hatchery-Sandbox": "sbx_forged3333333333"})
r = c.getresponse(); out["third"] = json.loads(r.read())
c.request("GET", "/big/3000000")
r = c.getresponse(); out["big"] = len(r.read())
c.close()
d = http.client.HTTPConnection("127.0.0.1", 9103, timeout=20)
d.request("GET", "/")
r = d.getresponse(); out["down"] = [r.status, json.loads(r.read())]
print(json.dumps(out))
'''

RAW_CLIENT = r'''
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=20)
f = s.makefile("rb")
hello = f.readline().decode()
s.sendall(b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 forged\r\n")
echo = f.readline().decode()
print(hello + echo, end="")
'''


def identities(seen):
    return [v for k, v in seen["headers"] if k == "x-hatchery-sandbox"]


def guest_http(d, sid):
    r = d.exec(sid, argv=["python3", "-c", HTTP_CLIENT], timeout_seconds=60)
    assert r["exit_code"] == 0, r
    return json.loads(r["stdout"])


def test_http_service_gets_an_identity_the_guest_cannot_forge(hsd):
    d = hsd
    sid = d.create(ttl_seconds=300)
    out = guest_http(d, sid)
    assert identities(out["first"]) == [sid], out["first"]
    assert out["first"]["path"] == "/first?x=1"
    assert identities(out["second"]) == [sid], "every request on a kept-alive connection"
    assert out["second"]["body_sha256"] == out["sent_sha"]
    assert identities(out["third"]) == [sid], "a Connection header cannot drop the identity"
    assert out["big"] == 3000000
    status, body = out["down"]
    assert status == 502 and body["error"]["code"] == "host_service_unavailable"
    assert str(hsd.port) not in json.dumps(body), "no host address is shown"
    # Another sandbox gets its own identity.
    other = d.create(ttl_seconds=300)
    assert identities(guest_http(d, other)["first"]) == [other]
    assert metric(d, 'hatchery_relay_connections_total{kind="host_service"}') >= 4
    assert metric(d, 'hatchery_relay_bytes_total{direction="from_guest",kind="host_service"}') >= 300000
    assert metric(d, 'hatchery_relay_bytes_total{direction="to_guest",kind="host_service"}') >= 3000000
    wait_relays_closed(d)


def test_raw_services_get_a_proxy_protocol_line(hsd, services):
    d = hsd
    sid = d.create(ttl_seconds=300)
    for port in (9101, 9102):  # unix socket and TCP upstreams
        r = d.exec(sid, argv=["python3", "-c", RAW_CLIENT, str(port)])
        assert r["exit_code"] == 0, r
        hello, echo = r["stdout"].splitlines()
        # The first line is the host's; whatever the guest sends is data.
        assert hello == f"hello PROXY UNKNOWN {sid}"
        assert echo == "echo PROXY TCP4 1.2.3.4 5.6.7.8 1 2 forged"
    wait_relays_closed(d)


def test_the_sandbox_still_has_no_route_to_the_host(hsd, services):
    d = hsd
    sid = d.create(ttl_seconds=300)
    gw = d.exec(sid, "awk 'NR>1 && $2==\"00000000\" {print $3}' /proc/net/route")["stdout"].strip()
    host = ".".join(str(b) for b in bytes.fromhex(gw)[::-1])
    probe = ("import socket,sys\nfor h, p in zip(sys.argv[1::2], sys.argv[2::2]):\n try:\n"
             "  socket.create_connection((h, int(p)), timeout=2).close(); print('open', h, p)\n"
             " except OSError as e:\n  print('closed', h, p)\n")
    args = [host, str(services["http"]), host, str(services["tcp"]), "127.0.0.1", str(services["http"]),
            "127.0.0.1", "9100"]
    r = d.exec(sid, argv=["python3", "-c", probe, *args])
    lines = r["stdout"].splitlines()
    # The service's real address is unreachable, the guest port works.
    assert lines == [f"closed {host} {services['http']}", f"closed {host} {services['tcp']}",
                     f"closed 127.0.0.1 {services['http']}", "open 127.0.0.1 9100"], lines


def test_pooled_and_forked_sandboxes_have_working_listeners(services):
    d = Daemon(extra_args=["--pool-size", "2", *flags(services)]).start()
    try:
        wait_baked(d)
        wait_for(lambda: metric(d, "hatchery_pool_ready") >= 2, timeout=120, what="pool of 2")
        ids = []
        for _ in range(2):
            r = d.request("POST", "/v1/sandboxes", {"ttl_seconds": 300})
            assert r.status == 201 and r.json()["boot_mode"] == "pool", r
            ids.append(r.json()["id"])
            d.created.add(ids[-1])
        for sid in ids:
            assert identities(guest_http(d, sid)["first"]) == [sid]
        # A restore without the pool, and a fork of a running session.
        r = d.request("POST", "/v1/sandboxes", {"ttl_seconds": 300})
        assert r.status == 201 and r.json()["boot_mode"] in ("pool", "restore"), r
        d.created.add(r.json()["id"])
        assert identities(guest_http(d, r.json()["id"])["first"]) == [r.json()["id"]]
        snap = d.request("POST", f"/v1/sandboxes/{ids[0]}/snapshots", {})
        assert snap.status == 201, snap
        fork = d.request("POST", f"/v1/snapshots/{snap.json()['id']}/fork", {"ttl_seconds": 120})
        assert fork.status == 201, fork
        fid = fork.json()["sandboxes"][0]["id"]
        d.created.add(fid)
        assert identities(guest_http(d, fid)["first"]) == [fid], "the fork speaks as itself"
        d.request("DELETE", f"/v1/snapshots/{snap.json()['id']}")
        wait_relays_closed(d)
    finally:
        d.cleanup()


def test_guest_connections_are_capped_per_sandbox(hsd, services):
    d = hsd
    sid = d.create(ttl_seconds=300)
    before = services["tcp_srv"].accepted
    many = r'''
import socket, time
socks, ok = [], 0
for i in range(70):
    s = socket.create_connection(("127.0.0.1", 9102), timeout=30)
    socks.append(s)
for s in socks:
    try:
        ok += s.makefile("rb").readline().startswith(b"hello PROXY")
    except OSError:
        pass
for s in socks:
    s.close()
time.sleep(1)
s = socket.create_connection(("127.0.0.1", 9102), timeout=30)
print(ok, s.makefile("rb").readline().decode().strip())
'''
    r = d.exec(sid, argv=["python3", "-c", many], timeout_seconds=120)
    assert r["exit_code"] == 0, r
    ok, after = r["stdout"].strip().split(" ", 1)
    assert int(ok) == 64, r
    assert after == f"hello PROXY UNKNOWN {sid}"
    assert services["tcp_srv"].accepted - before == 65
    assert d.exec(sid, "echo fine")["stdout"] == "fine\n"
    wait_relays_closed(d)


def test_listeners_follow_a_daemon_restart(services):
    d = Daemon(extra_args=["--pool-size", "0", *flags(services)[:2]]).start()
    d2 = None
    try:
        sid = d.create(ttl_seconds=300)
        assert identities(guest_http_first(d, sid)) == [sid]
        d.crash()
        # The next daemon knows one more service; the adopted sandbox
        # listens for it and keeps its identity.
        # Same network prefix and range: the new daemon must re-adopt the
        # crashed one's slots (a fresh prefix would leave them behind).
        net = ["--net-prefix", d.net_prefix, "--net-range", arg(d.extra_args, "--net-range")]
        d2 = Daemon(extra_args=["--pool-size", "0", *flags(services), *net], data_dir=d.data_dir).start()
        d2.created |= d.created
        assert identities(guest_http(d2, sid)["first"]) == [sid]
        r = d2.exec(sid, argv=["python3", "-c", RAW_CLIENT, "9102"])
        assert r["stdout"].startswith(f"hello PROXY UNKNOWN {sid}"), r
        wait_relays_closed(d2)
    finally:
        (d2 or d).cleanup()


def guest_http_first(d, sid):
    code = ("import http.client, json\nc = http.client.HTTPConnection('127.0.0.1', 9100, timeout=20)\n"
            "c.request('GET', '/'); print(c.getresponse().read().decode())")
    r = d.exec(sid, argv=["python3", "-c", code])
    assert r["exit_code"] == 0, r
    return json.loads(r["stdout"])


def test_a_connection_close_request_gets_its_whole_answer(hsd):
    """urllib (and any HTTP/1.0-style client) sends `Connection: close`; the
    relay's HTTP server then answers, half-closes and drops the stream. The
    agent used to take that drop as an abort and throw away the answer it
    had not yet written to the guest socket (RemoteDisconnected in the
    guest). Now it writes the answer, then closes."""
    d = hsd
    sid = d.create(ttl_seconds=300)
    code = ("import json, urllib.request as u\n"
            "for n in (10, 3000000):\n"
            "    r = u.urlopen(u.Request(f'http://127.0.0.1:9100/big/{n}'), timeout=20)\n"
            "    print(r.status, len(r.read()))\n"
            "r = u.urlopen(u.Request('http://127.0.0.1:9100/echo', data=b'x' * 1000, method='POST'), timeout=20)\n"
            "print(r.status, json.loads(r.read())['path'])\n")
    r = d.exec(sid, argv=["python3", "-c", code], timeout_seconds=60)
    assert r["exit_code"] == 0, r
    assert r["stdout"].splitlines() == ["200 10", "200 3000000", "200 /echo"], r
    wait_relays_closed(d)
