"""The broker's calls to the outside over TLS (issue 37 item 5):
`http_fetch` to an https server is verified against the broker's trust
(--broker-ca-file), and a server whose certificate that trust does not
vouch for gets no request. (`open_pr`'s forge is https in every broker
test: forge.py.)"""

import json
import os
import shutil
import ssl
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from broker_support import add_repo
from egress_servers import make_ca
from test_broker_policy import answers

HERE = os.path.dirname(__file__)


def tls_server(host, cert, key):
    hits = []

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_GET(self):
            hits.append(self.path)
            b = b"hello over tls"
            self.send_response(200)
            self.send_header("Content-Length", str(len(b)))
            self.end_headers()
            self.wfile.write(b)

    srv = ThreadingHTTPServer((host, 0), H)
    srv.daemon_threads = True
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, hits


def test_http_fetch_speaks_verified_https(bd, forge):
    # Trusted: a certificate from the CA the broker is given (the forge's).
    good, good_hits = tls_server(forge.host, os.path.join(forge.tls_dir, "srv.pem"),
                                 os.path.join(forge.tls_dir, "srv.key"))
    # Not trusted: the same address, a CA the broker never heard of.
    other = tempfile.mkdtemp(prefix="hxothca-")
    _, cert, key = make_ca(other, forge.host)
    bad, bad_hits = tls_server(forge.host, cert, key)
    try:
        gp, bp = good.server_address[1], bad.server_address[1]
        r = bd.request("POST", "/v1/policies", {"name": "fetch-tls", "rules": [
            {"id": "fetch-test-servers", "effect": "allow",
             "match": {"tools": ["http_fetch"], "hosts": [f"{forge.host}/32"], "ports": [gp, bp]}}]})
        assert r.status == 201, r
        calls = [[1, "http_fetch", {"url": f"https://{forge.host}:{gp}/hello"}],
                 [2, "http_fetch", {"url": f"https://{forge.host}:{bp}/hello"}]]
        files = {"agent.py": open(os.path.join(HERE, "calls_agent.py")).read(), "calls.json": json.dumps(calls)}
        repo, _ = add_repo(bd.git_server, "fetch-tls", files)
        sid = bd.new_session(repo, "fetch over tls", policy_id=r.json()["id"],
                             agent={"kind": "command", "command": "python3 agent.py"})
        bd.wait_state(sid, "completed")
        bd.track_sandboxes(sid)
        got = answers(bd, sid)
        assert got[1]["status"] == "done", got[1]
        assert got[1]["output"] == {"status": 200, "body": "hello over tls"}, got[1]
        assert good_hits == ["/hello"]
        assert got[2]["status"] == "failed", got[2]
        assert "certificate" in got[2]["output"]["error"].lower(), got[2]
        assert bad_hits == [], "no request reaches a server the broker cannot verify"
    finally:
        for s in (good, bad):
            s.shutdown()
            s.server_close()
        shutil.rmtree(other, ignore_errors=True)
