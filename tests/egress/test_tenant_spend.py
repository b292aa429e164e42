"""A tenant's spend through the daemon's model gateway stays bounded when
its upstream lies (issue 36): two sessions of one tenant spend at the same
time against a scripted model that bills twice what each call could cost
(one session on every call, the other on every second call), then a third
session takes the room the tenant's recorded spend leaves. Recorded spend
stays within each limit plus the largest reservation, and the upstream's
own total (what it reported, which is what it bills) within the tenant's
bound plus one reservation: once what the upstream reported has used up
the tenant's limit, no session of the tenant reaches it again. Before the
gateway counted reported excess against a scope's limit, each session went
on until its capped charges filled its budget and the third session was
given the excess as room, so the upstream billed about twice the limit."""

import time

import pytest

from gateway_daemon import gateway_daemon
from scripted_model import ScriptedModel
from sessions_support import DEMO_FILES

TENANT_TOKENS = 100_000
SESSION_TOKENS = 50_000
STEPS = 40


def shell(cmd):
    return {"tool_calls": [{"name": "shell", "arguments": {"command": cmd}}]}


@pytest.fixture(scope="module")
def model():
    lie = dict(shell("true"), overbill=2)
    m = ScriptedModel({
        "liar": [lie] * STEPS,
        "mixed": [lie if i % 2 else shell("true") for i in range(STEPS)],
    }).start()
    yield m
    m.stop()


@pytest.fixture
def gd(model, agent_templates):
    with gateway_daemon(model, agent_templates, "hxgwt-") as d:
        yield d


def as_key(d, key, method, path, body=None):
    return d.request(method, path, body, auth=False, headers={"Authorization": f"Bearer {key}"})


def new_session(d, key, repo, script, tokens):
    r = as_key(d, key, "POST", "/v1/sessions", {
        "repo": repo, "task": f"[script:{script}] spend", "template": "agent-session",
        "budget": {"tokens": tokens, "wall_s": 600}})
    assert r.status == 201, r
    return r.json()["session_id"]


def ended(d, sid, timeout=400):
    deadline = time.time() + timeout
    while True:
        s = d.session(sid)
        if s["state"] in ("completed", "failed", "cancelled"):
            d.track_sandboxes(sid)
            return s
        assert time.time() < deadline, s
        time.sleep(0.5)


def test_an_over_reporting_upstream_is_not_called_past_the_tenant_s_limit(gd, git_server, model):
    d = gd
    r = d.request("POST", "/v1/tenants", {"name": "liars", "limits": {"tokens": TENANT_TOKENS}})
    assert r.status == 201, r
    tid = r.json()["id"]
    key = d.request("POST", f"/v1/tenants/{tid}/keys").json()["key"]
    repo = git_server.add_repo("tenant-spend", DEMO_FILES)
    before = len(model.requests)

    a = new_session(d, key, repo, "liar", SESSION_TOKENS)
    b = new_session(d, key, repo, "mixed", SESSION_TOKENS)
    sessions = {a: ended(d, a), b: ended(d, b)}
    # What the tenant's recorded spend leaves, as session creates count it.
    room = TENANT_TOKENS - sum(s["spend"]["tokens"] for s in sessions.values())
    c = None
    if room > 0:
        c = new_session(d, key, repo, "mixed", room)
        sessions[c] = ended(d, c)

    evs = {sid: d.all_events(sid) for sid in sessions}
    reservations = [e["reserved_tokens"] for v in evs.values() for e in v if e["type"] == "model_call_intent"]
    calls = [e for v in evs.values() for e in v if e["type"] == "model_call"]
    assert reservations and calls, evs
    largest = max(reservations)
    # The upstream lied, and was charged no more than each reservation.
    lied = [e for e in calls if e["input_tokens"] + e["output_tokens"] > e["tokens"]]
    assert lied, calls
    for sid, s in sessions.items():
        limit = SESSION_TOKENS if sid != c else room
        assert s["state"] == "failed" and s["reason"].startswith("budget_exhausted"), (sid, s)
        spent = sum(e["tokens"] for e in evs[sid] if e["type"] == "model_call")
        assert s["spend"]["tokens"] == spent <= limit + largest, (sid, s["spend"], limit, largest)
    recorded = sum(s["spend"]["tokens"] for s in sessions.values())
    assert recorded <= TENANT_TOKENS + largest, (recorded, largest)

    # Every call the upstream served is one of these sessions' and was
    # logged with the upstream's figures.
    served = model.requests[before:]
    assert len(served) == len(calls), (len(served), len(calls))
    billed = sum(r["usage"]["total_tokens"] for r in served)
    assert billed == sum(e["input_tokens"] + e["output_tokens"] for e in calls), billed
    assert billed <= TENANT_TOKENS + largest + largest, (billed, TENANT_TOKENS, largest, len(served))
