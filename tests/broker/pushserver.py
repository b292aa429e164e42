"""A real git smart-HTTP server for the broker tests: `git http-backend`
(CGI) behind a small threaded HTTP server on loopback that demands a
write credential (HTTP Basic) for every request. Every ref update the
repositories take is logged by a post-receive hook, so a test can count
pushes. Optional delay before receive-pack runs, so a test can kill the
daemon while a push is in flight."""

import base64
import http.server
import os
import socketserver
import subprocess
import threading
import time

HOOK = """#!/bin/sh
while read old new ref; do echo "$old $new $ref" >> "$GIT_DIR/pushes.log"; done
"""


def install_hook(bare):
    p = os.path.join(bare, "hooks", "post-receive")
    with open(p, "w") as f:
        f.write(HOOK)
    os.chmod(p, 0o755)


def pushes(bare):
    """[(old, new, ref)] in the order the remote took them."""
    try:
        with open(os.path.join(bare, "pushes.log")) as f:
            return [tuple(l.split()) for l in f if l.strip()]
    except FileNotFoundError:
        return []


class PushServer:
    def __init__(self, root, user="hatchery-bot", password="s3cret-write-token", host="127.0.0.1"):
        self.root, self.user, self.password = root, user, password
        self.host = host
        self.secret = password
        self.header = "Authorization: Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.receive_delay = 0.0
        self.receive_started = []    # times a receive-pack POST arrived
        self.refused = 0
        srv = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _body(self):
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = b""
                    while True:
                        n = int(self.rfile.readline().strip().split(b";")[0], 16)
                        if n == 0:
                            self.rfile.readline()
                            return out
                        out += self.rfile.read(n)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _handle(self):
                body = self._body() if self.command == "POST" else b""
                auth = self.headers.get("Authorization", "")
                if auth != srv.header.split(": ", 1)[1]:
                    srv.refused += 1
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="git"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                path, _, query = self.path.partition("?")
                if path.endswith("/git-receive-pack"):
                    srv.receive_started.append(time.time())
                    if srv.receive_delay:
                        time.sleep(srv.receive_delay)
                env = {
                    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                    "GIT_PROJECT_ROOT": srv.root, "GIT_HTTP_EXPORT_ALL": "1",
                    "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null",
                    "REQUEST_METHOD": self.command, "PATH_INFO": path, "QUERY_STRING": query,
                    "CONTENT_TYPE": self.headers.get("Content-Type", ""),
                    "CONTENT_LENGTH": str(len(body)), "REMOTE_USER": srv.user, "REMOTE_ADDR": "127.0.0.1",
                    "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
                }
                r = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True)
                head, _, payload = r.stdout.partition(b"\r\n\r\n")
                if not _:
                    head, _, payload = r.stdout.partition(b"\n\n")
                status = 200
                headers = []
                for line in head.decode("latin-1").splitlines():
                    k, _, v = line.partition(":")
                    if k.lower() == "status":
                        status = int(v.strip().split()[0])
                    elif k:
                        headers.append((k, v.strip()))
                self.send_response(status)
                for k, v in headers:
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = _handle
            do_POST = _handle

        class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.httpd = S((host, 0), H)
        self.port = self.httpd.server_address[1]

    def start(self):
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()
