"""One `all` daemon is its own control plane and its one host: /readyz
says so without a key, GET /v1/hosts lists it ready, and a cordon makes
it refuse new sandboxes (503 host_cordoned) while it keeps serving the
ones it runs, until an uncordon."""

from harness import metric, wait_for

SHARED_DAEMON = True


def test_readyz_answers_without_a_key_once_the_host_is_ready(daemon):
    r = daemon.request("GET", "/readyz", auth=False)
    assert r.status == 200, r
    body = r.json()
    assert body["ready"] is True and body["failing"] == [], body
    names = {c["name"]: c["ok"] for c in body["checks"]}
    # Role `all`: the host's checks and the control plane's; not_stopping
    # turns false when a SIGTERM starts the drain.
    assert names == {"reconciled": True, "listening": True, "lease_held": True,
                     "database": True, "ready_host": True, "not_stopping": True}, body


def test_the_one_host_is_listed_ready(daemon):
    r = daemon.request("GET", "/v1/hosts")
    assert r.status == 200, r
    hosts = r.json()["hosts"]
    assert len(hosts) == 1, hosts
    h = hosts[0]
    assert h["state"] == "ready", h
    assert h["address"].endswith(f":{daemon.port}"), h
    assert h["capacity"] > 0 and h["version"], h
    assert h["heartbeat_age_ms"] < 30_000, h
    one = daemon.request("GET", f"/v1/hosts/{h['id']}").json()
    assert (one["id"], one["state"], one["address"]) == (h["id"], "ready", h["address"]), one
    assert daemon.request("GET", "/v1/hosts", auth=False).status == 401
    r = daemon.request("GET", "/v1/hosts/no-such-host")
    assert (r.status, r.error_code()) == (404, "host_not_found"), r
    r = daemon.request("POST", f"/v1/hosts/{h['id']}:reboot")
    assert (r.status, r.error_code()) == (400, "invalid_request"), r


def test_cordon_refuses_creates_and_uncordon_restores_them(daemon):
    host = daemon.request("GET", "/v1/hosts").json()["hosts"][0]["id"]
    kept = daemon.create(ttl_seconds=300)
    try:
        r = daemon.request("POST", f"/v1/hosts/{host}:cordon")
        assert (r.status, r.json()["state"]) == (200, "cordoned"), r
        r = daemon.request("POST", "/v1/sandboxes", {"ttl_seconds": 60})
        assert (r.status, r.error_code()) == (503, "host_cordoned"), r
        assert "uncordon" in r.json()["error"]["message"], r
        # The sandbox it runs is still served.
        assert daemon.exec(kept, "echo still")["stdout"].strip() == "still"
        # Cordoned is not ready for new work: /readyz of `all` says so.
        r = daemon.request("GET", "/readyz", auth=False)
        assert (r.status, r.json()["failing"]) == (503, ["ready_host"]), r
        wait_for(lambda: metric(daemon, "hatchery_hosts", 'state="cordoned"') == 1,
                 timeout=15, what="hosts gauge shows the cordon")
        # A drain keeps refusing; an uncordon ends either.
        r = daemon.request("POST", f"/v1/hosts/{host}:drain")
        assert (r.status, r.json()["state"]) == (200, "draining"), r
        r = daemon.request("POST", "/v1/sandboxes", {"ttl_seconds": 60})
        assert (r.status, r.error_code()) == (503, "host_draining"), r
    finally:
        r = daemon.request("POST", f"/v1/hosts/{host}:uncordon")
    assert (r.status, r.json()["state"]) == (200, "ready"), r
    sid = daemon.create(ttl_seconds=60)
    assert daemon.exec(sid, "echo ok")["stdout"].strip() == "ok"
    assert daemon.request("GET", "/readyz", auth=False).status == 200
