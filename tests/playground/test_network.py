"""Playground sandboxes are created with an explicit deny-all egress policy,
and are deleted even when the gateway is stopped while their run is cancelled."""

import json
import socket
import threading
import time
import uuid

import pytest

from netlab import PROBE, Peer
from pg_harness import read_until, sandboxes, wait_for


@pytest.fixture(scope="module")
def peer():
    p = Peer().up()
    yield p
    p.down()


def connect(daemon, sid, addr):
    """One real HTTP connection from inside the sandbox to addr:80 (netlab's
    PROBE): "open:…" or "blocked:…"."""
    spec = f"tcp,{addr},80"
    r = daemon.request("POST", f"/v1/sandboxes/{sid}/exec", {"argv": ["python3", "-c", PROBE, spec], "timeout_seconds": 20})
    assert r.status == 200 and r.json()["exit_code"] == 0, r
    return json.loads(r.json()["stdout"])[spec]


def test_playground_sandbox_egress_is_deny(gateway_factory, daemon, peer):
    g = gateway_factory()
    conn, r = g.open_run(f"# {uuid.uuid4().hex}\nimport time\nprint('up', flush=True)\ntime.sleep(20)\n")
    assert r.status == 200
    try:
        read_until(r, b"event: stdout")
        wait_for(lambda: len(sandboxes(daemon)) == 1, timeout=10, what="sandbox")
        (sbx,) = sandboxes(daemon)
        assert sbx["metadata"]["created_by"] == "hatchery-playground"
        pol = daemon.request("GET", f"/v1/sandboxes/{sbx['id']}/network")
        assert pol.status == 200, pol
        body = pol.json()
        assert body["egress"] == "deny" and body.get("allow", []) == [], body
        # A real connection out, to a server in the test's own namespace,
        # fails; the same probe succeeds once that address is opened (so
        # the failure is the policy, not a probe that cannot work).
        assert connect(daemon, sbx["id"], peer.addr).startswith("blocked:")
        r = daemon.request("PUT", f"/v1/sandboxes/{sbx['id']}/network", {"allow": [{"cidr": peer.addr, "ports": [80]}]})
        assert r.status == 200, r
        assert connect(daemon, sbx["id"], peer.addr).startswith(f"open:hello from {peer.addr}:80")
    finally:
        # The response still holds the socket: shut it down so the gateway
        # sees the visitor leave and kills the run now.
        conn.sock.shutdown(2)
        conn.close()
        # The fixture stops the gateway now; the stop waits for the run's
        # delete (the next test), and the fixture checks nothing is left.



class SlowDeletes:
    """A TCP proxy to the daemon on loopback that holds every DELETE for
    `hold` seconds and drops it if the client has gone meanwhile, as a
    request cut off by its process's exit would be."""

    def __init__(self, port, hold=2.0):
        self.port, self.hold = port, hold
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(16)
        self.addr = self.lsock.getsockname()
        self.dropped = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.lsock.accept()
            except OSError:
                return
            u = socket.create_connection(("127.0.0.1", self.port))
            threading.Thread(target=self._up, args=(c, u), daemon=True).start()
            threading.Thread(target=self._down, args=(u, c), daemon=True).start()

    def _up(self, c, u):
        try:
            while True:
                data = c.recv(65536)
                if not data:
                    break
                if data.startswith(b"DELETE "):
                    time.sleep(self.hold)
                    c.setblocking(False)
                    try:
                        gone = c.recv(1, socket.MSG_PEEK) == b""
                    except BlockingIOError:
                        gone = False
                    except OSError:
                        gone = True
                    c.setblocking(True)
                    if gone:
                        self.dropped += 1
                        break
                u.sendall(data)
        except OSError:
            pass
        for s in (c, u):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _down(self, u, c):
        try:
            while True:
                data = u.recv(65536)
                if not data:
                    break
                c.sendall(data)
        except OSError:
            pass

    def close(self):
        self.lsock.close()


def test_a_stop_waits_for_a_cancelled_run_to_delete_its_sandbox(gateway_factory, daemon):
    """The visitor leaves and the gateway is stopped at once: the run is a
    task of its own, which deletes its sandbox on the way out, and the stop
    waits for it. The daemon is reached through a proxy that holds each
    DELETE for 2 s, so a gateway that exited with its server (before the
    stop waited for runs) cut the delete off and left the sandbox to the
    TTL."""
    proxy = SlowDeletes(daemon.port)
    g = gateway_factory(env={"HATCHERY_URL": f"http://127.0.0.1:{proxy.addr[1]}"})
    left = []
    try:
        conn, r = g.open_run(f"# {uuid.uuid4().hex}\nimport time\nprint('up', flush=True)\ntime.sleep(20)\n")
        assert r.status == 200
        read_until(r, b"event: stdout")
        left = sandboxes(daemon)
        assert len(left) == 1
        conn.sock.shutdown(2)
        conn.close()
        t0 = time.time()
        g.stop()
        assert g.proc.returncode == 0, g.proc.returncode
        # Deleted before the process exited: nothing to wait for.
        assert sandboxes(daemon) == [] and proxy.dropped == 0, (proxy.dropped, g.log())
        assert time.time() - t0 >= proxy.hold - 0.5, "the stop did not wait for the held delete"
        left = []
    finally:
        proxy.close()
        for sbx in left:
            daemon.request("DELETE", f"/v1/sandboxes/{sbx['id']}")
