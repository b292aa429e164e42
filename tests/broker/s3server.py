"""A local S3-compatible object store for the anchoring tests: moto's
server (moto_server, pinned in s3-requirements.txt, from the test cache's
s3 venv) on a loopback port. moto does not check signatures, but it
treats a request without one as anonymous (private objects are 403 to
it), so the tests' own requests carry an unsigned Authorization header;
the daemon and the CLI sign theirs (presigned SigV4). With `tls` (a
MadeCA), moto serves https with a leaf certificate for 127.0.0.1 signed
by that CA (moto_server --ssl-cert/--ssl-key)."""

import os
import ssl
import subprocess
import time
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET

from harness import free_port

HERE = os.path.dirname(__file__)
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
VENV = os.environ.get("HATCHERY_S3_VENV", os.path.join(ROOT, "target", "s3-venv"))
NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
HEADERS = {
    "Authorization": "AWS4-HMAC-SHA256 Credential=hxtestkey/20261206/us-east-1/s3/aws4_request, "
                     "SignedHeaders=host, Signature=00",
    # Not urllib's form type, which the server would parse as a form.
    "Content-Type": "application/octet-stream",
}


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
        self.tls = tls
        self.base = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self.ctx = ssl.create_default_context(cafile=tls.ca) if tls else None
        self.proc = None

    def start(self):
        exe = os.path.join(VENV, "bin", "moto_server")
        assert os.path.exists(exe), f"{exe}: run `make broker-test` (it installs moto into the test cache)"
        self.log = open(os.path.join("/tmp", f"hx-moto-{self.port}.log"), "w")
        tls = ["--ssl-cert", self.tls.cert, "--ssl-key", self.tls.key] if self.tls else []
        self.proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(self.port), *tls],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                urllib.request.urlopen(self.base + "/", timeout=2, context=self.ctx).read()
                return self
            except (urllib.error.URLError, ConnectionError):
                assert self.proc.poll() is None, "moto_server exited"
                time.sleep(0.2)
        raise AssertionError("moto_server did not answer within 60 s")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.log.close()
        os.unlink(self.log.name)

    def _req(self, method, path, body=None):
        r = urllib.request.Request(self.base + path, data=body, method=method, headers=HEADERS)
        with urllib.request.urlopen(r, timeout=10, context=self.ctx) as a:
            return a.read()

    def create_bucket(self, name):
        self._req("PUT", f"/{name}")

    def keys(self, bucket, prefix):
        root = ET.fromstring(self._req("GET", f"/{bucket}?list-type=2&prefix={prefix}"))
        return [c.find(NS + "Key").text for c in root.iter(NS + "Contents")]

    def get(self, bucket, key):
        return self._req("GET", f"/{bucket}/{key}").decode()

    def put(self, bucket, key, body, headers=None):
        r = urllib.request.Request(f"{self.base}/{bucket}/{key}", data=body, method="PUT",
                                   headers={**HEADERS, **(headers or {})})
        try:
            with urllib.request.urlopen(r, timeout=10, context=self.ctx) as a:
                return a.status
        except urllib.error.HTTPError as e:
            return e.code
