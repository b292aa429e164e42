"""A local S3-compatible object store for the anchoring tests: moto's
server (moto_server, pinned in s3-requirements.txt, from the test cache's
s3 venv) on a loopback port. moto does not check signatures, but it
treats a request without one as anonymous (private objects are 403 to
it), so the tests' own requests carry an unsigned Authorization header;
the daemon and the CLI sign theirs (presigned SigV4)."""

import os
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


class S3Server:
    def __init__(self):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc = None

    def start(self):
        exe = os.path.join(VENV, "bin", "moto_server")
        assert os.path.exists(exe), f"{exe}: run `make broker-test` (it installs moto into the test cache)"
        self.log = open(os.path.join("/tmp", f"hx-moto-{self.port}.log"), "w")
        self.proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                urllib.request.urlopen(self.base + "/", timeout=2).read()
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
        with urllib.request.urlopen(r, timeout=10) as a:
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
            with urllib.request.urlopen(r, timeout=10) as a:
                return a.status
        except urllib.error.HTTPError as e:
            return e.code
