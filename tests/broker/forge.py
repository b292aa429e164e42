"""A small GitHub-compatible REST server for `open_pr` (the one piece
allowed a test double: no forge can run here). `POST
/repos/{owner}/{repo}/pulls` creates a pull request (Bearer token
required; 422 for a duplicate head/base pair, as GitHub does); `GET
/repos/{owner}/{repo}/pulls?head=owner:branch&state=all` lists them.
It speaks HTTPS only, with a certificate from a CA of its own
(`ca_path`, what the broker is told to trust with --broker-ca-file): the
token never travels in clear, as with a real forge."""

import http.server
import json
import shutil
import socketserver
import ssl
import tempfile
import threading
import urllib.parse

from egress_servers import make_ca


class Forge:
    def __init__(self, token="ghp_test-forge-token", host="127.0.0.2"):
        self.token = token
        self.host = host
        self.tls_dir = tempfile.mkdtemp(prefix="hxforge-")
        self.ca_path, cert, key = make_ca(self.tls_dir, host)
        self.pulls = []          # every created pull request, in order
        self.posts = 0           # POSTs that reached the handler
        self.lock = threading.Lock()
        srv = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _json(self, code, obj):
                b = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(b)))
                self.end_headers()
                self.wfile.write(b)

            def _auth(self):
                if self.headers.get("Authorization") != f"Bearer {srv.token}":
                    self._json(401, {"message": "Bad credentials"})
                    return False
                return True

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if not self._auth():
                    return
                parts = urllib.parse.urlsplit(self.path).path.strip("/").split("/")
                if len(parts) != 4 or parts[0] != "repos" or parts[3] != "pulls":
                    return self._json(404, {"message": "Not Found"})
                req = json.loads(body or b"{}")
                with srv.lock:
                    srv.posts += 1
                    owner, repo = parts[1], parts[2]
                    for p in srv.pulls:
                        if (p["_repo"] == (owner, repo) and p["head"]["ref"] == req.get("head")
                                and p["base"]["ref"] == req.get("base") and p["title"] == req.get("title")):
                            return self._json(422, {"message": "Validation Failed",
                                                    "errors": [{"message": "A pull request already exists"}]})
                    n = len(srv.pulls) + 1
                    pr = {"number": n, "state": "open", "title": req.get("title"), "body": req.get("body"),
                          "head": {"ref": req.get("head"), "label": f"{owner}:{req.get('head')}"},
                          "base": {"ref": req.get("base")},
                          "html_url": f"http://forge.invalid/{owner}/{repo}/pull/{n}", "_repo": (owner, repo)}
                    srv.pulls.append(pr)
                self._json(201, {k: v for k, v in pr.items() if not k.startswith("_")})

            def do_GET(self):
                if not self._auth():
                    return
                u = urllib.parse.urlsplit(self.path)
                parts = u.path.strip("/").split("/")
                if len(parts) != 4 or parts[0] != "repos" or parts[3] != "pulls":
                    return self._json(404, {"message": "Not Found"})
                q = urllib.parse.parse_qs(u.query)
                head = (q.get("head") or [""])[0]
                with srv.lock:
                    out = [{k: v for k, v in p.items() if not k.startswith("_")} for p in srv.pulls
                           if p["_repo"] == (parts[1], parts[2]) and (not head or p["head"]["label"] == head)]
                self._json(200, out)

        class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.httpd = S((host, 0), H)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.base = f"https://{host}:{self.port}"

    def start(self):
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        shutil.rmtree(self.tls_dir, ignore_errors=True)
