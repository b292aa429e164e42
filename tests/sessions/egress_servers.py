"""Servers the egress tests reach through the proxy, in a network namespace
the test creates (`egress_net`, a netlab.TestNet): HOST (`api.test` in
the docs) and OTHER (`other.test`) are two addresses of TEST-NET-2
(198.51.100.0/24, documentation-only, so never anyone's real server) on
the namespace's end of a veth; the host, where the daemon and its egress
proxy run, reaches them over that link. The proxy dials special-purpose
ranges only for a rule naming the address or its range, which is how the
suites' policies name them (an IP, or `HOST/32`); the names are IP
literals, in the certificate's SANs too, as the proxy resolves names with
the host's resolver and a test does not edit the host's /etc/hosts. On HOST:

- an HTTPS server with a test CA: `/hello`, a PEP 503 package index
  (`/simple/`) with one tiny wheel built here, and git over HTTPS
  (`git http-backend` as CGI under `/git/`);
  Under `/private/` the same index and git, for a client that sends
  `Authorization: Bearer <token>` (`token`; 401 otherwise): what a
  credential rule makes the egress proxy add (test_credentials_tools.py);
- a plain HTTP server (forward-proxy path);
- a server on a port the policy does not allow, which must see nothing.
"""

import base64
import hashlib
import io
import os
import shutil
import ssl
import subprocess
import tempfile
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from gitserver import GIT_ENV, git
from netlab import TestNet

# A /29 of 198.51.100.64/26 per lane and process (netlab's fake internet
# has 198.51.100.7 and .8): .1 the host's end of the veth, .2 HOST, .3
# OTHER. The lanes of `make test` run side by side, each suite in a lane
# alone, so a lane's suites never hold the same block at once.
_LANE = int(os.environ.get("HATCHERY_TEST_LANE", "0")) % 2
_N = os.getpid() % 4
_BASE = 64 + 32 * _LANE + 8 * _N
LINK = f"198.51.100.{_BASE + 1}"
HOST = f"198.51.100.{_BASE + 2}"
OTHER = f"198.51.100.{_BASE + 3}"
PKG = "tinypkg"
PKG_VALUE = "tiny-ok-42"


def egress_net():
    """The namespace HOST and OTHER live in (not yet up)."""
    tag = f"{_LANE}x{_N}"
    return TestNet(f"hxtegr{tag}", f"hxte{tag}r", f"hxte{tag}n", LINK, [HOST, OTHER], 29)


def make_ca(d, hosts=(HOST, OTHER), cn="hatchery egress test CA"):
    """A test CA and a server certificate for the addresses `hosts` (one
    address, or several; openssl CLI)."""
    if isinstance(hosts, str):
        hosts = (hosts,)
    def run(*a):
        subprocess.run(["openssl", *a], check=True, capture_output=True, cwd=d)
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "2", "-subj", f"/CN={cn}")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "srv.key", "-out", "srv.csr",
        "-subj", f"/CN={hosts[0]}")
    with open(os.path.join(d, "ext.cnf"), "w") as f:
        san = ",".join(f"IP:{h}" for h in hosts)
        f.write(f"subjectAltName={san}\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
                "extendedKeyUsage=serverAuth\n")
    run("x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "srv.pem", "-days", "2", "-extfile", "ext.cnf")
    return os.path.join(d, "ca.pem"), os.path.join(d, "srv.pem"), os.path.join(d, "srv.key")


def _b64(digest):
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def build_wheel():
    """tinypkg-0.1-py3-none-any.whl, made by hand (a wheel is a zip with a
    dist-info directory and a RECORD of hashes)."""
    files = {
        f"{PKG}/__init__.py": f"VALUE = {PKG_VALUE!r}\n".encode(),
        f"{PKG}-0.1.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {PKG}\nVersion: 0.1\n".encode(),
        f"{PKG}-0.1.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: hatchery-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{p},sha256={_b64(hashlib.sha256(b).digest())},{len(b)}\n" for p, b in files.items())
    record += f"{PKG}-0.1.dist-info/RECORD,,\n"
    files[f"{PKG}-0.1.dist-info/RECORD"] = record.encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for p, b in files.items():
            z.writestr(p, b)
    return f"{PKG}-0.1-py3-none-any.whl", buf.getvalue()


class _Server:
    def __init__(self, net, handler, tls=None):
        # Bound inside the namespace; served from this process's threads.
        self.httpd = net.call(lambda: ThreadingHTTPServer((HOST, 0), handler))
        self.httpd.daemon_threads = True
        if tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*tls)
            self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class EgressServers:
    def __init__(self, net):
        """`net`: egress_net(), up (the caller takes it down)."""
        self.dir = tempfile.mkdtemp(prefix="hxegr-")
        self.ca, cert, key = make_ca(self.dir)
        self.ca_pem = open(self.ca).read()
        self.wheel_name, self.wheel = build_wheel()
        self.git_root = os.path.join(self.dir, "git")
        os.makedirs(self.git_root)
        self._lib_repo()
        self.hits = {"https": [], "http": [], "denied": []}
        self.token = "hx-index-token-" + os.urandom(12).hex()
        # (method, path, whether the token came) of each /private/ request.
        self.private = []
        # (method, path, Authorization header or None) of every request to
        # the HTTPS server: what a host-side git fetch sent (issue 36).
        self.auth = []
        lock = threading.Lock()
        outer = self

        class Base(BaseHTTPRequestHandler):
            kind = "https"

            def log_message(self, *a):
                pass

            def note(self):
                with lock:
                    outer.hits[self.kind].append((self.command, self.path))
                    if self.kind == "https":
                        outer.auth.append((self.command, self.path.split("?")[0],
                                           self.headers.get("Authorization")))

            def send(self, code, body, ctype="text/plain"):
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        class Https(Base):
            def unlock(self):
                """Strips `/private` off a private request that carries the
                token; False (answered 401) when it does not."""
                if not self.path.startswith("/private/"):
                    self.prefix = ""
                    return True
                ok = self.headers.get("Authorization") == f"Bearer {outer.token}"
                with lock:
                    outer.private.append((self.command, self.path.split("?")[0], ok))
                if not ok:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Bearer realm="private"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return False
                self.path, self.prefix = self.path[len("/private"):], "/private"
                return True

            def do_GET(self):
                self.note()
                if not self.unlock():
                    return
                p = self.path.split("?")[0]
                if p == "/hello":
                    return self.send(200, b"hello through the proxy\n")
                if p in ("/simple/", "/simple"):
                    return self.send(200, f'<a href="{self.prefix}/simple/{PKG}/">{PKG}</a>'.encode(), "text/html")
                if p in (f"/simple/{PKG}/", f"/simple/{PKG}"):
                    h = hashlib.sha256(outer.wheel).hexdigest()
                    link = f'<a href="{self.prefix}/packages/{outer.wheel_name}#sha256={h}">{outer.wheel_name}</a>'
                    return self.send(200, f"<html><body>{link}</body></html>".encode(), "text/html")
                if p == f"/packages/{outer.wheel_name}":
                    return self.send(200, outer.wheel, "application/octet-stream")
                if p.startswith("/git/"):
                    return self.cgi()
                self.send(404, b"not found\n")

            def do_POST(self):
                self.note()
                if not self.unlock():
                    return
                if self.path.startswith("/git/"):
                    return self.cgi()
                self.send(404, b"not found\n")

            def cgi(self):
                path, _, query = self.path[len("/git"):].partition("?")
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                env = dict(GIT_ENV, GIT_PROJECT_ROOT=outer.git_root, GIT_HTTP_EXPORT_ALL="1",
                           PATH_INFO=path, QUERY_STRING=query, REQUEST_METHOD=self.command,
                           CONTENT_TYPE=self.headers.get("Content-Type", ""), CONTENT_LENGTH=str(len(body)),
                           REMOTE_ADDR=self.client_address[0], SERVER_PROTOCOL="HTTP/1.1")
                if self.headers.get("Content-Encoding"):
                    env["HTTP_CONTENT_ENCODING"] = self.headers["Content-Encoding"]
                if self.headers.get("Git-Protocol"):
                    env["GIT_PROTOCOL"] = self.headers["Git-Protocol"]
                out = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True).stdout
                head, _, payload = out.partition(b"\r\n\r\n")
                if not _:
                    head, _, payload = out.partition(b"\n\n")
                status, headers = 200, []
                for line in head.decode().splitlines():
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

        class Plain(Base):
            kind = "http"

            def do_GET(self):
                self.note()
                self.send(200, b"plain http through the proxy\n")

        class Denied(Base):
            kind = "denied"

            def do_GET(self):
                self.note()
                self.send(200, b"this must never be reached\n")

        self.https = _Server(net, Https, tls=(cert, key))
        self.http = _Server(net, Plain)
        self.denied = _Server(net, Denied)

    def _lib_repo(self):
        work = tempfile.mkdtemp(prefix="hxegrw-")
        git("init", "-q", "-b", "main", cwd=work)
        with open(os.path.join(work, "hello.txt"), "w") as f:
            f.write("cloned over https\n")
        git("add", ".", cwd=work)
        git("commit", "-q", "-m", "lib", cwd=work)
        git("clone", "-q", "--bare", work, os.path.join(self.git_root, "lib.git"))
        shutil.rmtree(work, ignore_errors=True)

    def stop(self):
        for s in (self.https, self.http, self.denied):
            s.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
