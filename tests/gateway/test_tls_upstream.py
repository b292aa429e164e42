"""An https:// upstream: the gateway verifies it against the operator's CA
bundle (rustls) and sends the real key only inside TLS. The upstream is the
scripted one behind Python's ssl with a CA made here (openssl CLI); a
gateway trusting another CA refuses to talk to it and charges nothing."""

import os
import shutil
import ssl
import subprocess
import tempfile

import openai
import pytest

from scripted_upstream import Upstream
from test_gateway import REAL_KEY, Gateway


def make_ca(d, name):
    def run(*a):
        subprocess.run(["openssl", *a], check=True, capture_output=True, cwd=d)
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}-ca.key", "-out", f"{name}-ca.pem",
        "-days", "2", "-subj", f"/CN={name} test CA")
    return os.path.join(d, f"{name}-ca.pem")


@pytest.fixture(scope="module")
def tls_upstream():
    d = tempfile.mkdtemp(prefix="hxgwtls-")
    ca = make_ca(d, "good")
    other = make_ca(d, "other")

    def run(*a):
        subprocess.run(["openssl", *a], check=True, capture_output=True, cwd=d)
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "srv.key", "-out", "srv.csr", "-subj", "/CN=127.0.0.1")
    with open(os.path.join(d, "ext.cnf"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    run("x509", "-req", "-in", "srv.csr", "-CA", "good-ca.pem", "-CAkey", "good-ca.key", "-CAcreateserial",
        "-out", "srv.pem", "-days", "2", "-extfile", "ext.cnf")
    up = Upstream()
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(os.path.join(d, "srv.pem"), os.path.join(d, "srv.key"))
    # Same listening fd, so the serving thread's selector keeps working;
    # accepted connections are TLS from here on.
    up.server.socket = ctx.wrap_socket(up.server.socket, server_side=True)
    yield up, ca, other
    up.close()
    shutil.rmtree(d, ignore_errors=True)


def tls_gateway(up, ca):
    g = Gateway.__new__(Gateway)
    g.scheme = "https"
    Gateway.__init__(g, up, extra=["--upstream-ca-file", ca])
    return g


def test_tls_upstream_verified_with_the_operators_ca(tls_upstream):
    up, ca, _ = tls_upstream
    g = tls_gateway(up, ca)
    try:
        key = g.key("ses_tls")
        g.budget("session:ses_tls", tokens=100000)
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{g.port}/v1", api_key=key, max_retries=0)
        before = len(up.requests)
        r = c.chat.completions.create(model="gpt-test", max_tokens=20,
                                      messages=[{"role": "user", "content": "hello over tls"}])
        assert r.choices[0].message.content
        seen = up.requests[before:]
        assert len(seen) == 1 and seen[0]["headers"]["authorization"] == f"Bearer {REAL_KEY}"
        assert seen[0]["headers"]["host"] == f"127.0.0.1:{up.port}"
        # Calls settle just after they answer: read once settled.
        b = g.spent("session:ses_tls")
        assert b["used_tokens"] == r.usage.total_tokens > 0, b
        # Streaming passes through TLS as well.
        chunks = list(c.chat.completions.create(model="gpt-test", max_tokens=20, stream=True,
                                                messages=[{"role": "user", "content": "stream"}]))
        assert chunks and any(ch.usage for ch in chunks)
    finally:
        g.stop()


def test_an_upstream_the_ca_does_not_vouch_for_is_refused(tls_upstream):
    up, _, other = tls_upstream
    g = tls_gateway(up, other)
    try:
        key = g.key("ses_tls2")
        g.budget("session:ses_tls2", tokens=100000)
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{g.port}/v1", api_key=key, max_retries=0)
        before = len(up.requests)
        with pytest.raises(openai.APIStatusError) as e:
            c.chat.completions.create(model="gpt-test", max_tokens=20,
                                      messages=[{"role": "user", "content": "hello"}])
        assert e.value.status_code == 502 and e.value.body["code"] == "upstream_unavailable", e.value.body
        assert len(up.requests) == before, "no HTTP request reached an unverified upstream"
        st, b = g.admin("GET", "/admin/budgets/session:ses_tls2")
        assert b["used_tokens"] == 0 and b["reserved_tokens"] == 0, b
    finally:
        g.stop()
