"""A local S3-compatible object store for the anchoring tests: moto's
server (moto_server, pinned in s3-requirements.txt, from the test cache's
s3 venv) on a loopback port, behind s3front.py, which checks every
request's SigV4 signature with botocore's signer and its payload hash
(moto checks neither) and refuses what S3 would (403
SignatureDoesNotMatch, 400 XAmzContentSHA256Mismatch, ...). The store
knows one key, KEY_ID/SECRET; `front_log()` says how each request was
signed and what the front decided. The tests' own requests are signed
here (`_sign`, header SigV4 with a signed payload), the daemon and the
CLI sign theirs. With `tls` (a MadeCA), the front serves https with a
leaf certificate for 127.0.0.1 signed by that CA."""

import datetime
import hashlib
import hmac
import json
import os
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET

from harness import free_port

HERE = os.path.dirname(__file__)
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
VENV = os.environ.get("HATCHERY_S3_VENV", os.path.join(ROOT, "target", "s3-venv"))
NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
KEY_ID, SECRET, REGION = "hxtestkey", "hxtestsecret", "us-east-1"


def _hmac(k, m):
    return hmac.new(k, m.encode(), hashlib.sha256).digest()


def _sign(method, host, path, query, headers, body):
    """The tests' own requests: SigV4 in the Authorization header, the
    body's SHA-256 signed (the front checks them as it checks the
    daemon's). `path` is already URI-encoded; `query` a list of pairs."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    h = {k.lower(): v for k, v in headers.items()}
    h.update({"host": host, "x-amz-date": now, "x-amz-content-sha256": hashlib.sha256(body).hexdigest()})
    names = sorted(h)
    q = "&".join(f"{urllib.parse.quote(k, safe='-_.~')}={urllib.parse.quote(v, safe='-_.~')}"
                 for k, v in sorted(query))
    canonical = "\n".join([method, path, q, "".join(f"{n}:{h[n].strip()}\n" for n in names),
                           ";".join(names), h["x-amz-content-sha256"]])
    scope = f"{now[:8]}/{REGION}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", now, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    k = ("AWS4" + SECRET).encode()
    for part in (now[:8], REGION, "s3", "aws4_request"):
        k = _hmac(k, part)
    sig = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
    h["authorization"] = (f"AWS4-HMAC-SHA256 Credential={KEY_ID}/{scope}, "
                          f"SignedHeaders={';'.join(names)}, Signature={sig}")
    # Not urllib's form type, which the server would parse as a form.
    h.setdefault("content-type", "application/octet-stream")
    return h


class MadeCA:
    """A CA and a leaf certificate for 127.0.0.1 it signs, made with
    openssl in `d` (P-256 keys, valid for a day): the store serves the
    leaf, and only a client given `ca` (PEM) trusts it."""

    def __init__(self, d):
        self.ca, self.cert, self.key = (os.path.join(d, n) for n in ("ca.pem", "leaf.pem", "leaf.key"))
        ca_key, csr, ext = (os.path.join(d, n) for n in ("ca.key", "leaf.csr", "leaf.ext"))
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        run = lambda *a: subprocess.run(["openssl", *a], check=True, capture_output=True, timeout=30)
        run("req", "-x509", *ec, "-keyout", ca_key, "-out", self.ca, "-days", "1",
            "-subj", "/CN=hatchery test CA",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        run("req", *ec, "-keyout", self.key, "-out", csr, "-subj", "/CN=127.0.0.1")
        with open(ext, "w") as f:
            f.write("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
                    "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n")
        run("x509", "-req", "-in", csr, "-CA", self.ca, "-CAkey", ca_key, "-CAcreateserial",
            "-out", self.cert, "-days", "1", "-extfile", ext)


class S3Server:
    def __init__(self, tls=None):
        self.port = free_port()
        self.moto_port = free_port()
        self.tls = tls
        self.base = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self.ctx = ssl.create_default_context(cafile=tls.ca) if tls else None
        self.procs = []

    def start(self):
        exe = os.path.join(VENV, "bin", "moto_server")
        assert os.path.exists(exe), f"{exe}: run `make broker-test` (it installs moto into the test cache)"
        self.log = open(os.path.join("/tmp", f"hx-moto-{self.port}.log"), "w")
        self.front_out = os.path.join("/tmp", f"hx-s3front-{self.port}.jsonl")
        self.keys_file = os.path.join("/tmp", f"hx-s3front-{self.port}.keys")
        with open(self.keys_file, "w") as f:
            json.dump({KEY_ID: SECRET}, f)
        self.procs.append(subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(self.moto_port)],
                                           stdout=self.log, stderr=subprocess.STDOUT))
        tls = [self.tls.cert, self.tls.key] if self.tls else []
        self.procs.append(subprocess.Popen(
            [os.path.join(VENV, "bin", "python"), os.path.join(HERE, "s3front.py"),
             str(self.port), str(self.moto_port), self.keys_file, REGION, *tls],
            stdout=open(self.front_out, "w"), stderr=self.log))
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                # Through the front: a signed list of buckets.
                self._req("GET", "/")
                return self
            except (urllib.error.URLError, ConnectionError):
                assert all(p.poll() is None for p in self.procs), "moto_server or s3front.py exited"
                time.sleep(0.2)
        raise AssertionError("moto_server did not answer through s3front.py within 60 s")

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
                p.wait(10)
        self.log.close()
        for f in (self.log.name, self.front_out, self.keys_file):
            os.unlink(f)

    def front_log(self):
        """Every request the front saw: {"method", "path", "auth"
        (header, query or -), "payload" (signed, unsigned or -),
        "verdict" (ok or the S3 error code it answered)}."""
        with open(self.front_out) as f:
            return [json.loads(line) for line in f if line.strip()]

    def _req(self, method, path, body=b"", headers=None, query=()):
        target = path + ("?" + urllib.parse.urlencode(list(query)) if query else "")
        h = _sign(method, f"127.0.0.1:{self.port}", path, list(query), headers or {}, body)
        r = urllib.request.Request(self.base + target, data=body if method == "PUT" else None,
                                   method=method, headers=h)
        with urllib.request.urlopen(r, timeout=10, context=self.ctx) as a:
            return a.read()

    def create_bucket(self, name):
        self._req("PUT", f"/{name}")

    def keys(self, bucket, prefix):
        root = ET.fromstring(self._req("GET", f"/{bucket}", query=[("list-type", "2"), ("prefix", prefix)]))
        return [c.find(NS + "Key").text for c in root.iter(NS + "Contents")]

    def get(self, bucket, key):
        return self._req("GET", f"/{bucket}/{key}").decode()

    def put(self, bucket, key, body, headers=None):
        try:
            self._req("PUT", f"/{bucket}/{key}", body, headers)
            return 200
        except urllib.error.HTTPError as e:
            return e.code
