"""Shared by the Python and TypeScript SDK suites: a real daemon (through
tests/integration/harness.py, with its leak checks) on a private copy of the
default template, and a small HTTP proxy in front of it that plays a
rate-limiting gateway or a connection that breaks mid-stream, so the SDKs'
handling of 429 and of truncated streams is tested against real HTTP."""

import atexit
import glob
import http.client
import http.server
import json
import os
import shutil
import socketserver
import subprocess
import sys
import tempfile
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))

from harness import KEY, TEMPLATES_DIR, Daemon, free_port, wait_baked  # noqa: E402

DEFAULT_TEMPLATE = "code-interpreter"
# A `host` rule name the daemons resolve from a hosts file (no DNS needed).
NET_HOST, NET_HOST_ADDR = "pypi.example", "203.0.113.9"
MAX_FILE_BYTES = 1 << 20


def private_templates():
    """A copy of the default template, so that template builds and deletes
    in the suites never touch the shared templates directory."""
    tdir = tempfile.mkdtemp(prefix="hxsdk-tpl-", dir="/tmp")
    subprocess.run(["cp", "-a", os.path.join(TEMPLATES_DIR, DEFAULT_TEMPLATE), tdir], check=True)
    return tdir


def seed_rootfs(templates_dir, name):
    """Gives template `name` the default template's rootfs (the rootfs key
    depends only on base and packages), so a build of a spec with no extra
    packages skips debootstrap and takes seconds instead of minutes."""
    src = glob.glob(os.path.join(templates_dir, DEFAULT_TEMPLATE, "rootfs-*"))[0]
    dst = os.path.join(templates_dir, name)
    os.makedirs(dst, exist_ok=True)
    subprocess.run(["cp", "-a", src, dst], check=True)


_net_flags = None


def net_args():
    """Daemons with sandbox networking (the harness gives each its own net
    prefix and range) resolve the `host` rules of the suites from a hosts
    file, so no DNS is needed."""
    global _net_flags
    if _net_flags is None:
        from harness import BIN_DIR
        out = subprocess.run([os.path.join(BIN_DIR, "hatcheryd"), "--help"], capture_output=True, text=True).stdout
        _net_flags = "--net-hosts-file" in out
    return ["--net-hosts-file", _hosts_file()] if _net_flags else []


_hosts = None


def _hosts_file():
    global _hosts
    if _hosts is None:
        fd, _hosts = tempfile.mkstemp(prefix="hxsdk-hosts-", dir="/tmp")
        os.write(fd, f"{NET_HOST_ADDR} {NET_HOST}\n".encode())
        os.close(fd)
        atexit.register(os.unlink, _hosts)
    return _hosts


def start_daemon(extra_args=(), templates_dir=None, bake=True):
    d = Daemon(extra_args=["--pool-size", "0", "--max-file-bytes", str(MAX_FILE_BYTES), *net_args(), *extra_args],
               templates_dir=templates_dir)
    try:
        d.start()
        if bake:
            wait_baked(d)
    except BaseException:
        d.stop()
        shutil.rmtree(d.data_dir, ignore_errors=True)
        raise
    return d


def live_sandboxes(d):
    r = d.request("GET", "/v1/sandboxes")
    assert r.status == 200, r
    return [s["id"] for s in r.json()["sandboxes"]]


def stop_daemon(d):
    """Fails if any sandbox is still listed, then the harness's cleanup
    checks that nothing of any sandbox is left on the host (processes,
    cgroups, mounts, state, and the daemon's netns, veths and nft table)."""
    left = live_sandboxes(d)
    for sid in left:
        d.created.add(sid)
    d.cleanup()
    assert not left, f"sandboxes left behind: {left}"


class Proxy:
    """Forwards to the daemon. Routes by a path prefix:

    /ratelimit/<token>/<n>/...  the first n requests with this token get a
                                429 with Retry-After: 1 and an error body in
                                the daemon's format; later ones go through.
    /cut/<bytes>/...            forwards, then drops the connection after
                                <bytes> bytes of the response body.
    """

    def __init__(self, port):
        self.upstream = port
        self.counts = {}
        self.lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _any(self):
                proxy.handle(self)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.server = Server(("127.0.0.1", free_port()), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def handle(self, h):
        parts = h.path.split("/")
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else None
        cut = None
        if len(parts) > 3 and parts[1] == "ratelimit":
            token, n, rest = parts[2], int(parts[3]), "/" + "/".join(parts[4:])
            with self.lock:
                self.counts[token] = self.counts.get(token, 0) + 1
                limited = self.counts[token] <= n
            if limited:
                data = json.dumps({"error": {"code": "rate_limited", "message": "slow down"}}).encode()
                h.send_response(429)
                h.send_header("Retry-After", "1")
                h.send_header("Content-Type", "application/json")
                h.send_header("Content-Length", str(len(data)))
                h.end_headers()
                h.wfile.write(data)
                return
        elif len(parts) > 2 and parts[1] == "cut":
            cut, rest = int(parts[2]), "/" + "/".join(parts[3:])
        else:
            rest = h.path
        up = http.client.HTTPConnection("127.0.0.1", self.upstream, timeout=120)
        headers = {k: v for k, v in h.headers.items() if k.lower() not in ("host", "connection", "content-length")}
        up.request(h.command, rest, body=body, headers=headers)
        r = up.getresponse()
        h.send_response(r.status)
        for k, v in r.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                h.send_header(k, v)
        h.send_header("Connection", "close")
        h.end_headers()
        h.close_connection = True
        sent = 0
        while True:
            chunk = r.read1(65536)
            if not chunk:
                break
            if cut is not None and sent + len(chunk) >= cut:
                h.wfile.write(chunk[: cut - sent])
                h.wfile.flush()
                break
            h.wfile.write(chunk)
            h.wfile.flush()
            sent += len(chunk)
        up.close()


def remove_templates(tdir):
    shutil.rmtree(tdir, ignore_errors=True)


__all__ = ["KEY", "Daemon", "Proxy", "start_daemon", "stop_daemon", "private_templates", "seed_rootfs",
           "live_sandboxes", "remove_templates", "MAX_FILE_BYTES"]
