"""E2B's header transforms (`network.rules`) through the official Python
SDK, end to end (docs/e2b.md, "Header transforms"): a runsc sandbox, the
daemon's egress proxy, and an HTTPS server of the test's own in a network
namespace it creates, on two addresses (198.19.3.0/29, per process), its
certificate from the test CA the daemon trusts for upstreams (conftest's
`egress_ca`, --egress-upstream-ca-file).

- the header reaches the server for the rules host, and only there: the
  other address gets none;
- no byte of the value is in the sandbox: every process's environ and
  cmdline, and readable files under / except /proc, /sys, /dev;
- the value is stored sealed as a secret of the sandbox's
  (`e2b.<sandbox>.<n>` in /v1/secrets, names only) and deleted with it;
- `/v1/secrets` refuses names in that space."""

import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
from harness import KEY

VALUE = "hx-e2b-hdr-" + os.urandom(12).hex()
PORT = 8443

# On both addresses: logs each request's address, path and the two headers
# rules may set (the log is the host's, never the sandbox's), answers
# whether the value arrived (never the value).
SERVER = r'''
import json, ssl, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
ADDRS, PORT, CERT, KEY, LOG, WANT = sys.argv[1].split(","), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
lock = threading.Lock()
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        key = self.headers.get("X-Api-Key")
        with lock, open(LOG, "a") as f:
            f.write(json.dumps({"addr": self.server.server_address[0], "path": self.path,
                                "x_api_key": key, "x_team": self.headers.get("X-Team")}) + "\n")
        out = b"seen\n" if key == WANT else b"none\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(CERT, KEY)
for a in ADDRS:
    s = ThreadingHTTPServer((a, PORT), H)
    s.daemon_threads = True
    s.socket = ctx.wrap_socket(s.socket, server_side=True)
    threading.Thread(target=s.serve_forever, daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
'''

# Inside the sandbox: the same scan as tests/egress/test_credentials.py
# (any 12-byte run of the value; it gets the value hex-encoded, so its
# own command line holds none).
SCAN = r'''
import os, sys
secret = bytes.fromhex(sys.argv[1])
runs = {secret[i:i + 12] for i in range(len(secret) - 11)}
def hit(data):
    return any(r in data for r in runs)
found, files = [], 0
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    for part in ("environ", "cmdline"):
        try:
            with open("/proc/%s/%s" % (pid, part), "rb") as f:
                if hit(f.read()):
                    found.append("/proc/%s/%s" % (pid, part))
        except OSError:
            pass
for root, dirs, names in os.walk("/"):
    if root == "/":
        dirs[:] = [d for d in dirs if d not in ("proc", "sys", "dev")]
    for n in names:
        p = os.path.join(root, n)
        try:
            if not os.path.isfile(p) or os.path.islink(p) or os.path.getsize(p) > 4 << 20:
                continue
            with open(p, "rb") as f:
                files += 1
                if hit(f.read()):
                    found.append(p)
        except OSError:
            pass
        if files >= 20000:
            break
print("found " + " ".join(found) if found else "clean %d" % files)
'''


def sh(*cmd, check=True):
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


class NsServer:
    """The HTTPS server in a namespace of the test's own, at the far end of
    a veth /29 from the host, on two addresses: `a` (the rules host) and
    `b` (another host)."""

    def __init__(self, ca):
        n = os.getpid() % 32
        self.ns = f"hxthdr{n}"
        self.host_if, self.ns_if = f"hxth{n}r", f"hxth{n}n"
        base = 8 * n
        self.host_addr = f"198.19.3.{base + 1}"
        self.a, self.b = f"198.19.3.{base + 2}", f"198.19.3.{base + 3}"
        self.ca = ca
        self.dir = tempfile.mkdtemp(prefix="hxhdr-")
        self.log = os.path.join(self.dir, "requests.jsonl")
        self.proc = None

    def make_cert(self):
        d = self.dir

        def run(*a):
            subprocess.run(["openssl", *a], check=True, capture_output=True, cwd=d)
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "srv.key", "-out", "srv.csr", "-subj", f"/CN={self.a}")
        with open(os.path.join(d, "ext.cnf"), "w") as f:
            f.write(f"subjectAltName=IP:{self.a},IP:{self.b}\nbasicConstraints=CA:FALSE\n"
                    "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n")
        run("x509", "-req", "-in", "srv.csr", "-CA", self.ca["pem"], "-CAkey", self.ca["key"],
            "-CAcreateserial", "-CAserial", os.path.join(d, "ca.srl"), "-out", "srv.pem", "-days", "2",
            "-extfile", "ext.cnf")

    def up(self):
        self.down()
        self.make_cert()
        sh("ip", "netns", "add", self.ns)
        sh("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if, "netns", self.ns)
        sh("ip", "addr", "add", f"{self.host_addr}/29", "dev", self.host_if)
        sh("ip", "link", "set", self.host_if, "up")
        for a in (self.a, self.b):
            sh("ip", "-n", self.ns, "addr", "add", f"{a}/29", "dev", self.ns_if)
        sh("ip", "-n", self.ns, "link", "set", self.ns_if, "up")
        sh("ip", "-n", self.ns, "link", "set", "lo", "up")
        sh("ip", "-n", self.ns, "route", "add", "default", "via", self.host_addr)
        script = os.path.join(self.dir, "server.py")
        with open(script, "w") as f:
            f.write(SERVER)
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, sys.executable, script, f"{self.a},{self.b}", str(PORT),
             os.path.join(self.dir, "srv.pem"), os.path.join(self.dir, "srv.key"), self.log, VALUE],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self.proc.stdout.readline().strip() == "ready"
        return self

    def requests(self):
        if not os.path.exists(self.log):
            return []
        with open(self.log) as f:
            return [json.loads(line) for line in f if line.strip()]

    def down(self):
        if self.proc:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
        sh("ip", "link", "del", self.host_if, check=False)
        sh("ip", "netns", "del", self.ns, check=False)

    def cleanup(self):
        self.down()
        shutil.rmtree(self.dir, ignore_errors=True)
        assert not os.path.exists(f"/run/netns/{self.ns}")


@pytest.fixture(scope="module")
def server(egress_ca):
    s = NsServer(egress_ca).up()
    yield s
    s.cleanup()


def api(d, method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", d.port, timeout=120)
    c.request(method, path, None if body is None else json.dumps(body),
              {"Authorization": f"Bearer {KEY}", "X-API-KEY": KEY, "Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, json.loads(data) if data else None


def e2b_secrets(d):
    status, body = api(d, "GET", "/v1/secrets")
    assert status == 200, body
    return {s["name"] for s in body["secrets"] if s["name"].startswith("e2b.")}


def test_the_header_reaches_the_rules_host_only_and_never_the_sandbox(daemon, server):
    from e2b import Sandbox
    a, b = server.a, server.b
    before = e2b_secrets(daemon)
    s = Sandbox.create("base", timeout=300, network={
        "allow_out": [a, b],
        "deny_out": lambda ctx: [ctx.all_traffic],
        "rules": {a: [{"transform": {"headers": {"X-Api-Key": VALUE, "X-Team": "blue"}}}]},
    })
    try:
        stored = e2b_secrets(daemon) - before
        # Both headers, sealed under the sandbox's names; never a value.
        assert len(stored) == 2, stored
        status, body = api(daemon, "GET", "/v1/secrets")
        assert VALUE not in json.dumps(body)

        # Through the proxy, trusting its CA (the variables the sandbox got).
        r = s.commands.run(f"curl -sS https://{a}:{PORT}/bound", timeout=60)
        assert r.stdout.strip() == "seen", (r.stdout, r.stderr)
        # Another host: a plain tunnel, no header (-k: the sandbox does not
        # trust the test CA, and the tunnel is not intercepted).
        r = s.commands.run(f"curl -sSk https://{b}:{PORT}/other", timeout=60)
        assert r.stdout.strip() == "none", (r.stdout, r.stderr)
        reqs = server.requests()
        bound = [q for q in reqs if q["path"] == "/bound"]
        other = [q for q in reqs if q["path"] == "/other"]
        assert bound and all(q["addr"] == a and q["x_api_key"] == VALUE and q["x_team"] == "blue"
                             for q in bound), bound
        assert other and all(q["addr"] == b and q["x_api_key"] is None and q["x_team"] is None
                             for q in other), other

        # The sandbox holds no byte run of the value anywhere it can read.
        s.files.write("/tmp/scan.py", SCAN)
        r = s.commands.run(f"python3 /tmp/scan.py {VALUE.encode().hex()}", timeout=240, user="root")
        assert r.stdout.startswith("clean "), r.stdout
        assert int(r.stdout.split()[1]) > 1000, r.stdout
        env = s.commands.run("env", timeout=30).stdout
        assert "HTTPS_PROXY=http://127.0.0.1:" in env and "SSL_CERT_FILE=" in env, env
    finally:
        s.kill()
    # Deleted with the sandbox.
    assert e2b_secrets(daemon) & stored == set()


def test_an_update_keeps_the_header_bound_and_rules_cannot_change(daemon, server):
    from e2b import Sandbox
    a, b = server.a, server.b
    s = Sandbox.create("base", timeout=300, network={
        "allow_out": [b], "deny_out": lambda ctx: [ctx.all_traffic],
        "rules": {a: [{"transform": {"headers": {"X-Api-Key": VALUE}}}]},
    })
    try:
        # `a` is not in allowOut: listed in rules, not allowed (as E2B).
        r = s.commands.run(f"curl -sS -m 10 https://{a}:{PORT}/before 2>&1; true", timeout=60)
        assert "seen" not in r.stdout, r.stdout
        # The update opens it; the proxy's policy follows.
        s.update_network({"allow_out": [a, b], "deny_out": ["0.0.0.0/0"]})
        r = s.commands.run(f"curl -sS https://{a}:{PORT}/after", timeout=60)
        assert r.stdout.strip() == "seen", (r.stdout, r.stderr)
        status, body = api(daemon, "PUT", f"/e2b/sandboxes/{s.sandbox_id}/network",
                           {"allowOut": [a], "rules": {a: [{"transform": {"headers": {"X": "y"}}}]}})
        assert status == 400 and '"rules" (header transforms) cannot be changed' in body["message"], body
    finally:
        s.kill()
    assert not [q for q in server.requests() if q["path"] == "/before"]


def test_the_secrets_api_keeps_the_e2b_names_to_itself(daemon):
    status, body = api(daemon, "POST", "/v1/secrets", {"name": "e2b.sbx_x.0", "value": "v"})
    assert status == 400 and "reserved" in body["error"]["message"], body


# Bad rules, sent as the SDKs send them: each is E2B's error shape
# (`{"code": 400, "message": ...}`), names the field and never the value,
# and leaves no sandbox and no stored value behind.
BAD_RULES = [
    ({"*": [{"transform": {"headers": {"X-Api-Key": VALUE}}}]}, 'network.rules host "*" is refused'),
    ({"*.com": [{"transform": {"headers": {"X-Api-Key": VALUE}}}]}, 'network.rules host "*.com" is too wide'),
    ({"198.19.3.0/29": [{"transform": {"headers": {"X-Api-Key": VALUE}}}]}, "is an address range"),
    ({"api.example.com": [{"transform": {"headers": {"X-Api-Key": VALUE}}, "match": "/v1"}]},
     'network.rules["api.example.com"][0].match is not supported by Hatchery'),
    ({"api.example.com": [{"transform": {"headers": {"X-Api-Key": VALUE}, "body": {"a": 1}}}]},
     'network.rules["api.example.com"][0].transform.body is not supported by Hatchery'),
    ({"api.example.com": [{"transform": {"headers": {"Host": VALUE}}}]}, "one the egress proxy writes itself"),
    ({"api.example.com": [{"transform": {"headers": {"X-Api-Key": VALUE + "\r\nX-Evil: 1"}}}]},
     "printable ASCII"),
    ({"api.example.com": [{"transform": {"headers": {"X-Api-Key": "v" * 4097}}}]}, "1–4096 bytes"),
]


@pytest.mark.parametrize("rules,want", BAD_RULES, ids=[str(i) for i in range(len(BAD_RULES))])
def test_bad_rules_are_e2b_400s_and_store_nothing(daemon, rules, want):
    before_secrets = e2b_secrets(daemon)
    status, body = api(daemon, "GET", "/v1/sandboxes")
    before = {s["id"] for s in body["sandboxes"]}
    status, body = api(daemon, "POST", "/e2b/sandboxes", {
        "templateID": "base", "timeout": 60,
        "network": {"allowOut": ["api.example.com", "198.19.3.2"], "rules": rules}})
    assert status == 400 and set(body) == {"code", "message"} and body["code"] == 400, body
    assert want in body["message"], body
    assert VALUE not in body["message"]
    status, after = api(daemon, "GET", "/v1/sandboxes")
    assert {s["id"] for s in after["sandboxes"]} == before
    assert e2b_secrets(daemon) == before_secrets
