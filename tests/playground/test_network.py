"""Playground sandboxes are created with an explicit deny-all egress policy."""

import uuid

from pg_harness import sandboxes, wait_for


def test_playground_sandbox_egress_is_deny(gateway_factory, daemon):
    g = gateway_factory()
    conn, r = g.open_run(f"# {uuid.uuid4().hex}\nimport time\nprint('up', flush=True)\ntime.sleep(20)\n")
    assert r.status == 200
    try:
        while not r.readline().startswith(b"event: stdout"):
            pass
        wait_for(lambda: len(sandboxes(daemon)) == 1, timeout=10, what="sandbox")
        (sbx,) = sandboxes(daemon)
        assert sbx["metadata"]["created_by"] == "hatchery-playground"
        pol = daemon.request("GET", f"/v1/sandboxes/{sbx['id']}/network")
        assert pol.status == 200, pol
        body = pol.json()
        assert body["egress"] == "deny" and body.get("allow", []) == [], body
    finally:
        # The response still holds the socket: shut it down so the gateway
        # sees the visitor leave and kills the run now.
        conn.sock.shutdown(2)
        conn.close()
        # Gone before the fixture stops the gateway: a stop that races the
        # cancelled run's delete is not what this test is about (a CI run
        # once found the sandbox still live 10 s after that stop).
        wait_for(lambda: not sandboxes(daemon), timeout=15, what="the run's sandbox deleted")
