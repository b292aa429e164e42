"""Tenant keys on sessions, their events, policies and rounds (issue 36),
against a real daemon: a tenant key reaching for another tenant's
session, its events, its policy or its round gets 404, exactly as for one
that does not exist; lists show only the tenant's own; idempotency keys
are per tenant; the operator key sees everything. A session's sandbox is
the caller's tenant's whatever the body names, and a round's sandboxes
are its tenant's, counted and limited by its live_sandboxes."""

import time

from sessions_support import DEMO_FILES

POLICY = {"name": "tenant-a", "rules": [{"id": "all", "effect": "allow"}]}

ROUND = {
    "name": "tenant round",
    "starter_files": {"solution.py": "def add(a, b):\n    pass\n"},
    "tests": {"files": {"test_hidden.py": "from solution import add\n\ndef test_add():\n    assert add(2, 3) == 5\n"}},
    "cpu_time_limit_ms": 2000,
    "session_seconds": 600,
}


def as_key(d, key, method, path, body=None):
    return d.request(method, path, body, auth=False, headers={"Authorization": f"Bearer {key}"})


def err(r):
    return (r.status, r.json()["error"]["code"])


def tenant(d, name, **limits):
    r = d.request("POST", "/v1/tenants", {"name": name, "limits": limits})
    assert r.status == 201, r
    tid = r.json()["id"]
    r = d.request("POST", f"/v1/tenants/{tid}/keys")
    assert r.status == 201, r
    return tid, r.json()["key"]


def other_id(i):
    """An id of the same shape that names nothing."""
    return i[:4] + ("a" if i[4] != "a" else "b") + i[5:]


def test_a_tenant_key_reaches_only_its_own_sessions_policies_and_rounds(sd, git_server):
    d = sd
    a, ka = tenant(d, "a")
    b, kb = tenant(d, "b")
    repo = git_server.add_repo("tenants", DEMO_FILES)

    # Policies: each tenant makes one; the built-in one is everyone's.
    r = as_key(d, ka, "POST", "/v1/policies", POLICY)
    assert r.status == 201 and r.json()["tenant"] == a, r
    pa = r.json()["id"]
    r = as_key(d, kb, "POST", "/v1/policies", dict(POLICY, name="tenant-b"))
    assert r.status == 201, r
    pb = r.json()["id"]
    r = d.request("POST", "/v1/policies", dict(POLICY, name="operator's"))
    assert r.status == 201 and "tenant" not in r.json(), r
    p_op = r.json()["id"]
    listed = lambda key: sorted(p["id"] for p in as_key(d, key, "GET", "/v1/policies").json()["policies"])
    assert listed(ka) == sorted([pa, "pol_standard"])
    assert listed(kb) == sorted([pb, "pol_standard"])
    assert {pa, pb, p_op} <= set(p["id"] for p in d.request("GET", "/v1/policies").json()["policies"])
    for pid in (pb, p_op, other_id(pb)):
        for method, path, body in (
            ("GET", f"/v1/policies/{pid}", None),
            ("GET", f"/v1/policies/{pid}/versions/1", None),
            ("POST", f"/v1/policies/{pid}/versions", POLICY),
        ):
            r = as_key(d, ka, method, path, body)
            assert err(r) == (404, "policy_not_found"), (method, path, r)
    assert as_key(d, ka, "GET", "/v1/policies/pol_standard").status == 200
    assert err(as_key(d, ka, "POST", "/v1/policies/pol_standard/versions", POLICY)) == (409, "policy_read_only")
    r = as_key(d, ka, "POST", f"/v1/policies/{pa}/versions", POLICY)
    assert r.status == 201 and (r.json()["version"], r.json()["tenant"]) == (2, a), r
    assert d.request("GET", f"/v1/policies/{pb}").json()["version"] == 1, "B's policy is untouched"

    # Sessions. A tenant pins only its own policy or the built-in one.
    body = {"repo": repo, "task": "t", "idempotency_key": "same-key"}
    for pid in (pb, p_op):
        r = as_key(d, ka, "POST", "/v1/sessions", dict(body, policy_id=pid))
        assert err(r) == (400, "policy_not_found"), (pid, r)
    r = as_key(d, ka, "POST", "/v1/sessions", dict(body, policy_id=pa))
    assert r.status == 201, r
    sa = r.json()["session_id"]
    # The same idempotency key from another tenant is another session.
    r = as_key(d, kb, "POST", "/v1/sessions", body)
    assert r.status == 201, r
    sb = r.json()["session_id"]
    assert sb != sa
    assert as_key(d, ka, "POST", "/v1/sessions", dict(body, policy_id=pa)).json()["session_id"] == sa

    s = as_key(d, ka, "GET", f"/v1/sessions/{sa}").json()
    assert (s["tenant"], s["policy_id"]) == (a, pa), s
    ids = lambda key: [x["session_id"] for x in as_key(d, key, "GET", "/v1/sessions").json()["sessions"]]
    assert ids(ka) == [sa] and ids(kb) == [sb]
    assert {sa, sb} <= set(x["session_id"] for x in d.request("GET", "/v1/sessions").json()["sessions"])
    assert as_key(d, ka, "GET", f"/v1/sessions/{sa}/events").status == 200

    # B's session (and events) answer A exactly as a missing session does.
    for sid in (sb, other_id(sb)):
        for method, path, body in (
            ("GET", f"/v1/sessions/{sid}", None),
            ("GET", f"/v1/sessions/{sid}/events", None),
            ("GET", f"/v1/sessions/{sid}/events?after=0&limit=10", None),
            ("POST", f"/v1/sessions/{sid}/messages", {"text": "hi"}),
            ("POST", f"/v1/sessions/{sid}:cancel", None),
            ("POST", f"/v1/sessions/{sid}/cancel", None),
            ("POST", f"/v1/sessions/{sid}/approvals/apr_aaaaaaaaaaaaaaaa", {"decision": "approve"}),
            ("GET", f"/v1/sessions/{sid}/blobs/sha256-0", None),
            ("POST", f"/v1/sessions/{sid}/policy", {"version": 1}),
        ):
            r = as_key(d, ka, method, path, body)
            assert err(r) == (404, "session_not_found"), (method, path, r)
    assert d.request("GET", f"/v1/sessions/{sb}").json()["state"] != "cancelled", "B's session is untouched"

    # A revoked key is refused at once, on the sessions' routes too.
    kid = d.request("GET", f"/v1/tenants/{b}/keys").json()["keys"][0]["id"]
    assert d.request("DELETE", f"/v1/tenants/{b}/keys/{kid}").status in (200, 204)
    assert err(as_key(d, kb, "GET", "/v1/sessions")) == (401, "unauthorized")
    _, kb = tenant(d, "b2")

    # Rounds: B's round answers A 404 round_not_found, and A's list is A's.
    r = as_key(d, kb, "POST", "/v1/rounds", ROUND)
    assert r.status == 201 and r.json()["tenant"] != a, r
    rb = r.json()["id"]
    rounds = lambda key: [x["id"] for x in as_key(d, key, "GET", "/v1/rounds").json()["rounds"]]
    assert rounds(ka) == [] and rounds(kb) == [rb]
    for rid in (rb, other_id(rb)):
        for method, path, body in (
            ("GET", f"/v1/rounds/{rid}", None),
            ("GET", f"/v1/rounds/{rid}/sessions", None),
            ("POST", f"/v1/rounds/{rid}/sessions", {"candidate": "x@example.com"}),
            ("POST", f"/v1/rounds/{rid}/reviewer-tokens", {"ttl_seconds": 60}),
            ("POST", f"/v1/rounds/{rid}/archive", None),
        ):
            r = as_key(d, ka, method, path, body)
            assert err(r) == (404, "round_not_found"), (method, path, r)
    assert d.request("GET", f"/v1/rounds/{rb}").json()["state"] == "ready", "B's round is untouched"
    assert as_key(d, kb, "POST", f"/v1/rounds/{rb}/archive").status == 200

    for sid in (sa, sb):
        d.request("POST", f"/v1/sessions/{sid}:cancel")
        d.track_sandboxes(sid)


def test_a_tenant_s_sessions_reserve_its_limits_at_create(sd, git_server):
    """Two sessions of one tenant at once hold their budgets; a third the
    tenant has no room for is 429 tenant_budget_exhausted and stored
    nowhere; a session that ends gives back what it did not use."""
    d = sd
    r = d.request("POST", "/v1/tenants", {"name": "small", "limits": {"tokens": 3000, "concurrent_sessions": 2}})
    assert r.status == 201, r
    tid = r.json()["id"]
    key = d.request("POST", f"/v1/tenants/{tid}/keys").json()["key"]
    repo = git_server.add_repo("reserve", DEMO_FILES)

    def new(tokens):
        return as_key(d, key, "POST", "/v1/sessions", {"repo": repo, "task": "[script:ask] t", "budget": {"tokens": tokens}})

    r1, r2 = new(1000), new(1500)
    assert r1.status == 201 and r2.status == 201, (r1, r2)
    s1, s2 = r1.json()["session_id"], r2.json()["session_id"]
    r = new(600)
    assert err(r) == (429, "tenant_budget_exhausted"), r
    assert "tokens" in r.json()["error"]["message"] and "2500 held" in r.json()["error"]["message"], r
    r = new(400)
    assert err(r) == (429, "tenant_budget_exhausted") and "concurrent_sessions" in r.json()["error"]["message"], r
    listed = [x["session_id"] for x in as_key(d, key, "GET", "/v1/sessions").json()["sessions"]]
    assert sorted(listed) == sorted([s1, s2]), "a refused create stores nothing"
    # The operator is not limited by the tenant's room.
    assert d.request("POST", "/v1/sessions", {"repo": repo, "task": "[script:ask] op"}).status == 201

    # s1 ends having spent nothing (no gateway here: spend is not
    # metered): its whole budget comes back.
    r = as_key(d, key, "POST", f"/v1/sessions/{s1}:cancel")
    assert r.status == 200 and r.json()["state"] == "cancelled", r
    spent = r.json()["spend"]["tokens"]
    r3 = new(3000 - 1500 - spent)
    assert r3.status == 201, r3
    assert err(new(1)) == (429, "tenant_budget_exhausted")
    for sid in (s1, s2, r3.json()["session_id"]):
        d.track_sandboxes(sid)


def test_a_tenant_with_an_unfinished_session_is_not_deleted(sd, git_server):
    """DELETE /v1/tenants/{id} counts sessions, not only sandboxes: 409
    tenant_in_use while one is unfinished (whatever its sandbox is doing),
    204 once it has ended and its sandbox is gone."""
    import time

    d = sd
    t, key = tenant(d, "in-use")
    repo = git_server.add_repo("tenant-in-use", DEMO_FILES)
    r = as_key(d, key, "POST", "/v1/sessions", {"repo": repo, "task": "t"})
    assert r.status == 201, r
    sid = r.json()["session_id"]
    try:
        r = d.request("DELETE", f"/v1/tenants/{t}")
        assert err(r) == (409, "tenant_in_use"), r
        assert "1 live sessions" in r.json()["error"]["message"], r
        assert d.request("GET", f"/v1/tenants/{t}").status == 200, "nothing deleted"
    finally:
        r = d.request("POST", f"/v1/sessions/{sid}:cancel")
        assert r.status == 200, r
    assert d.request("GET", f"/v1/sessions/{sid}").json()["state"] == "cancelled"
    # Its sandbox (the tenant's too) is removed as the session ends.
    deadline = time.time() + 60
    while True:
        r = d.request("DELETE", f"/v1/tenants/{t}")
        if r.status == 204 or time.time() > deadline:
            break
        assert err(r) == (409, "tenant_in_use") and "0 live sessions" in r.json()["error"]["message"], r
        time.sleep(0.5)
    assert r.status == 204, r
    assert d.request("GET", f"/v1/tenants/{t}").status == 404


def test_a_tenant_cannot_plant_a_session_sandbox_in_another_s_account(sd, git_server):
    """metadata.tenant in a tenant's session body is overwritten with the
    caller's tenant (as a sandbox create's is): the session and its sandbox
    are the caller's, and the named tenant neither sees nor reaches the
    sandbox, nor is it kept from being deleted by it."""
    d = sd
    a, ka = tenant(d, "planter")
    v, kv = tenant(d, "victim")
    repo = git_server.add_repo("tenant-plant", DEMO_FILES)
    r = as_key(d, ka, "POST", "/v1/sessions",
               {"repo": repo, "task": "[script:ask] plant", "metadata": {"tenant": v, "team": "x"}})
    assert r.status == 201, r
    sid = r.json()["session_id"]
    try:
        deadline = time.time() + 120
        while True:
            s = d.session(sid)
            if s["waiting"] == "message" or time.time() > deadline:
                break
            assert s["state"] in ("queued", "starting", "running"), s
            time.sleep(0.2)
        assert s["waiting"] == "message" and s["sandbox_id"], s
        assert (s["tenant"], s["metadata"]) == (a, {"tenant": a, "team": "x"}), s
        sbx = s["sandbox_id"]
        meta = d.request("GET", f"/v1/sandboxes/{sbx}").json()["metadata"]
        assert meta.get("tenant") == a and meta.get("hatchery_session") == sid, meta

        # Not the victim's: not listed, not reachable, not counted.
        assert as_key(d, kv, "GET", "/v1/sandboxes").json()["sandboxes"] == []
        r = as_key(d, kv, "POST", f"/v1/sandboxes/{sbx}/exec", {"cmd": "true"})
        assert err(r) == (404, "sandbox_not_found"), r
        assert [x["id"] for x in as_key(d, ka, "GET", "/v1/sandboxes").json()["sandboxes"]] == [sbx]
        r = d.request("DELETE", f"/v1/tenants/{v}")
        assert r.status == 204, r
    finally:
        d.request("POST", f"/v1/sessions/{sid}:cancel")
        d.track_sandboxes(sid)


def test_a_round_s_sandboxes_are_its_tenant_s_and_pass_its_live_sandboxes_limit(sd):
    """A tenant's round makes its sandboxes (through the sandbox API, with
    the operator key) recording the tenant: the candidate's sandbox is in
    the tenant's list and fills a live_sandboxes limit of 1, so the
    tenant's next create (a sandbox or another candidate's) is 429
    tenant_limit, as the sandbox API answers it."""
    d = sd
    t, k = tenant(d, "interviews", live_sandboxes=1)
    r = as_key(d, k, "POST", "/v1/rounds", ROUND)
    assert r.status == 201, r
    rid = r.json()["id"]
    r = as_key(d, k, "POST", f"/v1/rounds/{rid}/sessions", {"candidate": "ada@example.com"})
    assert r.status == 201, r
    mine = as_key(d, k, "GET", "/v1/sandboxes").json()["sandboxes"]
    assert len(mine) == 1, mine
    sbx = mine[0]
    d.created.add(sbx["id"])
    assert sbx["metadata"].get("tenant") == t, sbx
    assert sbx["metadata"].get("hatchery.round") == rid, sbx
    assert sbx["metadata"].get("hatchery.kind") == "round-session", sbx

    r = as_key(d, k, "POST", "/v1/sandboxes", {"ttl_seconds": 60})
    assert err(r) == (429, "tenant_limit") and "live_sandboxes" in r.json()["error"]["message"], r
    r = as_key(d, k, "POST", f"/v1/rounds/{rid}/sessions", {"candidate": "bob@example.com"})
    assert err(r) == (429, "tenant_limit") and "live_sandboxes" in r.json()["error"]["message"], r
    assert len(as_key(d, k, "GET", "/v1/sandboxes").json()["sandboxes"]) == 1
    # The operator's own sandboxes are not the tenant's to count.
    r = d.request("POST", "/v1/sandboxes", {"ttl_seconds": 60})
    assert r.status == 201, r
    d.created.add(r.json()["id"])
    d.request("DELETE", f"/v1/sandboxes/{r.json()['id']}")
    assert as_key(d, k, "POST", f"/v1/rounds/{rid}/archive").status == 200
