"""The gateway reached from inside a real sandbox through the daemon's
host-service relay: the guest holds no key at all; the relay sets
X-Hatchery-Sandbox (the guest cannot forge it) and the gateway charges the
session that sandbox is bound to. Teardown is checked."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../integration"))
from harness import Daemon  # noqa: E402

from scripted_upstream import Upstream  # noqa: E402
from test_gateway import Gateway  # noqa: E402

GUEST_PORT = 8089

CALL = r'''
import json, sys, urllib.request, urllib.error
req = urllib.request.Request("http://127.0.0.1:%d/v1/chat/completions", method="POST",
    data=json.dumps({"model": "gpt-test", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}).encode(),
    headers={"content-type": "application/json", "x-hatchery-sandbox": sys.argv[1]})
try:
    r = urllib.request.urlopen(req, timeout=20)
    print(r.status, json.loads(r.read())["choices"][0]["message"]["content"])
except urllib.error.HTTPError as e:
    print(e.code, json.loads(e.read())["error"]["code"])
''' % GUEST_PORT


@pytest.fixture
def stack():
    up = Upstream()
    g = Gateway(up, extra=["--trust-sandbox-header"])
    d = Daemon(extra_args=["--pool-size", "0", "--max-ttl", "3600",
                           "--host-service", f"gateway={GUEST_PORT}=127.0.0.1:{g.port}"]).start()
    yield up, g, d
    d.cleanup()
    g.stop()
    up.close()


def guest_call(d, sid, claim):
    d.put_file(sid, "/tmp/call.py", CALL.encode())
    r = d.exec(sid, argv=["python3", "/tmp/call.py", claim], timeout_seconds=30)
    assert r["exit_code"] == 0, r["stderr"]
    return r["stdout"].strip()


def test_a_bound_sandbox_calls_the_model_without_any_key(stack):
    up, g, d = stack
    a, b = d.create(ttl_seconds=300), d.create(ttl_seconds=300)
    st, _ = g.admin("PUT", f"/admin/sandboxes/{a}", {"session": "ses_in_a", "tenant": "acme"})
    assert st == 200
    g.budget("session:ses_in_a", tokens=100000)
    # The guest even claims to be sandbox b: the relay replaces the header.
    out = guest_call(d, a, b)
    assert out.startswith("200 hello"), out
    assert g.spent("session:ses_in_a")["used_tokens"] > 0
    assert up.requests[-1]["headers"]["authorization"].endswith("sk-upstream-real-key-0123456789")
    assert "x-hatchery-sandbox" not in up.requests[-1]["headers"], "identity is not passed upstream"
    # b is not bound to any session: refused, nothing sent upstream.
    n = len(up.requests)
    assert guest_call(d, b, a) == "401 unbound_sandbox"
    assert len(up.requests) == n
    # Unbinding ends a's access.
    assert g.admin("DELETE", f"/admin/sandboxes/{a}")[0] == 204
    assert guest_call(d, a, a) == "401 unbound_sandbox"
    # Nothing in either sandbox holds a credential of the gateway or upstream.
    for sid in (a, b):
        r = d.exec(sid, "env; cat /proc/1/environ 2>/dev/null | tr '\\0' '\\n'; grep -rl sk-upstream / "
                        "--exclude-dir=proc --exclude-dir=sys 2>/dev/null | head -3", timeout_seconds=60)
        assert "sk-upstream" not in r["stdout"] and "hxg_" not in r["stdout"], r
