"""Policies through the live daemon: /v1/policies behind the API key,
versions that never change once written, validation errors that name the
rule, and policies that survive a daemon restart (policies.db)."""

from harness import Daemon

DOC = {"name": "ci", "rules": [
    {"id": "push-own", "effect": "allow",
     "match": {"tools": ["git_push"], "args": [{"field": "branch", "op": "eq", "value": {"ctx": "session_branch"}}]}},
    {"id": "push-main", "effect": "deny",
     "match": {"tools": ["git_push"], "args": [{"field": "branch", "op": "in", "value": ["main", "master"]}]}},
]}


def test_policy_lifecycle_and_errors(daemon):
    assert daemon.request("GET", "/v1/policies", auth=False).status == 401
    r = daemon.request("GET", "/v1/policies")
    assert r.status == 200, r
    assert [p["id"] for p in r.json()["policies"]] == ["pol_standard"]

    r = daemon.request("POST", "/v1/policies", DOC)
    assert r.status == 201, r
    p = r.json()
    pid = p["id"]
    assert p["version"] == 1 and p["document"] == DOC and not p["builtin"]

    doc2 = dict(DOC, rules=DOC["rules"][:1])
    r = daemon.request("POST", f"/v1/policies/{pid}/versions", doc2)
    assert r.status == 201 and r.json()["version"] == 2, r
    assert daemon.request("GET", f"/v1/policies/{pid}").json()["version"] == 2
    assert daemon.request("GET", f"/v1/policies/{pid}/versions/1").json()["document"] == DOC

    bad = {"name": "x", "rules": [DOC["rules"][0],
                                  {"id": "big", "effect": "deny",
                                   "match": {"args": [{"field": "diff_lines", "op": "gt", "value": "500"}]}}]}
    r = daemon.request("POST", f"/v1/policies/{pid}/versions", bad)
    assert r.status == 400 and r.error_code() == "invalid_policy", r
    assert r.json()["error"]["message"].startswith('rule 1 (id "big")'), r
    assert daemon.request("GET", f"/v1/policies/{pid}").json()["version"] == 2, "a refused version leaves nothing"

    r = daemon.request("POST", "/v1/policies/pol_standard/versions", DOC)
    assert r.status == 409 and r.error_code() == "policy_read_only", r
    r = daemon.request("GET", "/v1/policies/pol_ffffffffffffffff")
    assert r.status == 404 and r.error_code() == "policy_not_found", r
    r = daemon.request("GET", f"/v1/policies/{pid}/versions/3")
    assert r.status == 404 and r.error_code() == "policy_version_not_found", r
    r = daemon.request("POST", "/v1/policies", raw=b"x" * ((1 << 20) + 1),
                       headers={"Content-Type": "application/json"})
    assert r.status == 413 and r.error_code() == "too_large", r

    doc = daemon.request("GET", "/openapi.json").json()
    assert "/v1/policies/{id}/versions/{version}" in doc["paths"]


def test_policies_survive_a_restart():
    d = Daemon(extra_args=["--pool-size", "0"]).start()
    try:
        pid = d.request("POST", "/v1/policies", DOC).json()["id"]
        d.stop()
        d.start()
        r = d.request("GET", f"/v1/policies/{pid}/versions/1")
        assert r.status == 200 and r.json()["document"] == DOC, r
        assert d.request("GET", "/v1/policies/pol_standard").json()["version"] == 2
    finally:
        d.cleanup()
