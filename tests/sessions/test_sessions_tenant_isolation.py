"""Tenant isolation of environments and of the operator's git credential
(issue 36), against a real daemon:

- a tenant key lists, reads, builds and deletes only its own tenant's
  environments and starts sessions only from those; another tenant's (and
  the operator's) answer 404 environment_not_found, exactly as a missing
  one; the operator key reaches all;
- the operator's git credential (--sessions-git-credential-file) goes with
  a tenant's fetch only to a host on --sessions-git-credential-host: a
  tenant's session and environment build fetching from a host not listed
  send no Authorization header (the HTTPS git server records what it
  received); the operator's session still sends it."""

import os
import shutil
import tempfile

import pytest

from egress_servers import HOST, EgressServers, egress_net
from harness import KEY
from sessions_support import DEMO_FILES, SessionDaemon
from test_environments import build
from test_sessions_tenants import as_key, err, other_id, tenant

TOKEN = "hx-operator-git-token-36b"


@pytest.fixture(scope="module")
def https_git():
    net = egress_net().up()
    try:
        s = EgressServers(net)
        yield s
        s.stop()
    finally:
        net.down()
    assert not net.left(), net.left()


@pytest.fixture
def cd(model, https_git, monkeypatch):
    """A daemon with the operator's git credential, listed for another
    host only; its git trusts the HTTPS git server's test CA."""
    d = tempfile.mkdtemp(prefix="hxt-tencred-")
    cred = os.path.join(d, "git-credential")
    with open(cred, "w") as f:
        f.write(f"Authorization: Bearer {TOKEN}\n")
    monkeypatch.setenv("GIT_SSL_CAINFO", https_git.ca)
    s = SessionDaemon(model.port, extra=["--sessions-git-credential-file", cred,
                                         "--sessions-git-credential-host", "git.operator.invalid"]).start()
    yield s
    try:
        r = s.request("GET", "/v1/environments")
        if r.status == 200:
            for e in r.json()["environments"]:
                s.request("DELETE", f"/v1/environments/{e['environment_id']}")
    finally:
        s.cleanup_sessions()
        shutil.rmtree(d, ignore_errors=True)


def fetched(srv, since):
    """The Authorization headers of the git requests after `since`."""
    return [a for (_, p, a) in srv.auth[since:] if p.startswith("/git/lib.git/")]


def checked_out(d, key, repo):
    """A session of `key` on `repo`, waited for until its repository is
    checked out, then cancelled."""
    r = as_key(d, key, "POST", "/v1/sessions", {"repo": repo, "task": "[script:ask] t"})
    assert r.status == 201, r
    sid = r.json()["session_id"]
    d.wait_event(sid, "repo_checked_out", timeout=120)
    d.request("POST", f"/v1/sessions/{sid}:cancel")
    d.track_sandboxes(sid)
    return sid


def test_a_tenant_s_fetch_gets_no_operator_credential_off_the_list(cd, https_git):
    d, srv = cd, https_git
    repo = f"https://{HOST}:{srv.https.port}/git/lib.git"
    _, ka = tenant(d, "cred-a")

    # The operator's session: the credential goes, as before.
    n = len(srv.auth)
    checked_out(d, KEY, repo)
    sent = fetched(srv, n)
    assert sent and all(a == f"Bearer {TOKEN}" for a in sent), sent

    # A tenant's session on the same (unlisted) host: fetched, no header.
    n = len(srv.auth)
    checked_out(d, ka, repo)
    sent = fetched(srv, n)
    assert sent and all(a is None for a in sent), sent

    # A tenant's environment build fetches without it too.
    r = as_key(d, ka, "POST", "/v1/environments", {"name": "cred", "repo": repo})
    assert r.status == 201, r
    eid = r.json()["environment_id"]
    n = len(srv.auth)
    evs = build(d, eid, key=ka)
    assert evs[-1][0] == "done", evs[-3:]
    sent = fetched(srv, n)
    assert sent and all(a is None for a in sent), sent


def test_environments_are_their_tenant_s(sd, git_server):
    d = sd

    a, ka = tenant(d, "env-a")
    b, kb = tenant(d, "env-b")
    repo = git_server.add_repo("tenant-envs", DEMO_FILES)
    mk = lambda key, name: as_key(d, key, "POST", "/v1/environments", {"name": name, "repo": repo})
    r = mk(ka, "a")
    assert r.status == 201 and r.json()["tenant"] == a, r
    ea = r.json()["environment_id"]
    r = mk(kb, "b")
    assert r.status == 201 and r.json()["tenant"] == b, r
    eb = r.json()["environment_id"]
    r = mk(KEY, "op")
    assert r.status == 201 and "tenant" not in r.json(), r
    eop = r.json()["environment_id"]
    # B's and the operator's are built, so that only the tenant check can
    # refuse A's session from them.
    for key, eid in ((kb, eb), (KEY, eop)):
        evs = build(d, eid, key=key)
        assert evs[-1][0] == "done", evs[-3:]

    listed = lambda key: sorted(e["environment_id"] for e in as_key(d, key, "GET", "/v1/environments").json()["environments"])
    assert listed(ka) == [ea] and listed(kb) == [eb]
    assert {ea, eb, eop} <= set(listed(KEY))

    for eid in (eb, eop, other_id(eb)):
        for method, path in (("GET", f"/v1/environments/{eid}"),
                             ("POST", f"/v1/environments/{eid}:build"),
                             ("DELETE", f"/v1/environments/{eid}")):
            r = as_key(d, ka, method, path)
            assert err(r) == (404, "environment_not_found"), (method, path, r)
        r = as_key(d, ka, "POST", "/v1/sessions", {"environment_id": eid, "task": "t"})
        assert err(r) == (404, "environment_not_found"), (eid, r)
    assert as_key(d, ka, "GET", "/v1/sessions").json()["sessions"] == [], "nothing stored"
    # Untouched: still there, with their one version.
    for key, eid in ((kb, eb), (KEY, eop)):
        r = as_key(d, key, "GET", f"/v1/environments/{eid}")
        assert r.status == 200 and len(r.json()["versions"]) == 1, r

    # The tenant's own works; the operator reaches a tenant's.
    assert as_key(d, ka, "GET", f"/v1/environments/{ea}").status == 200
    assert as_key(d, KEY, "GET", f"/v1/environments/{eb}").json()["tenant"] == b
    r = as_key(d, kb, "POST", "/v1/sessions", {"environment_id": eb, "task": "[script:ask] t"})
    assert r.status == 201, r
    sid = r.json()["session_id"]
    d.request("POST", f"/v1/sessions/{sid}:cancel")
    d.wait_state(sid, "cancelled")
    d.track_sandboxes(sid)
    for key, eid in ((ka, ea), (kb, eb), (KEY, eop)):
        r = as_key(d, key, "DELETE", f"/v1/environments/{eid}")
        assert r.status == 204, (eid, r)
