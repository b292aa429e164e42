"""The sessions API against a real daemon: validation, idempotency, the
event log as JSON pages and as SSE (reconnects get every event exactly
once), the open-stream cap, and async failure of an unfetchable repo."""

import threading
import time

from sessions_support import DEMO_FILES, SessionDaemon, sse_events


def err(r):
    return (r.status, r.json()["error"]["code"])


def test_bad_input_is_refused_and_nothing_is_created(sd, git_server):
    repo = git_server.add_repo("bad", DEMO_FILES)
    ok = {"repo": repo, "task": "t"}
    cases = [
        (dict(ok, policy_id="pol_nope"), (400, "policy_not_found")),
        (dict(ok, template="no-such-template"), (404, "template_not_found")),
        (dict(ok, template="Bad_Name"), (400, "invalid_request")),
        (dict(ok, budget={"tokens": -1}), (400, "invalid_budget")),
        (dict(ok, budget={"wall_s": -5}), (400, "invalid_budget")),
        (dict(ok, budget={"tokens": 10_000_001}), (400, "invalid_budget")),
        (dict(ok, budget={"usd_cents": 10_001}), (400, "invalid_budget")),
        (dict(ok, budget={"wall_s": 0}), (400, "invalid_budget")),
        (dict(ok, repo="ssh://host/r.git"), (400, "invalid_repo")),
        (dict(ok, repo="git@github.com:acme/api.git"), (400, "invalid_repo")),
        (dict(ok, repo="http://127.0.0.1/r.git"), (400, "invalid_repo")),
        (dict(ok, repo="file:///etc"), (400, "invalid_repo")),
        (dict(ok, repo="https://u:p@host/r.git"), (400, "invalid_repo")),
        (dict(ok, repo="https://host/r.git x"), (400, "invalid_repo")),
        (dict(ok, ref="-upload-pack=sh"), (400, "invalid_request")),
        (dict(ok, task=""), (400, "invalid_request")),
        (dict(ok, task="x" * (64 * 1024 + 1)), (400, "invalid_request")),
        (dict(ok, env={"HATCHERY_X": "1"}), (400, "invalid_request")),
        (dict(ok, metadata={"hatchery_session": "ses_x"}), (400, "invalid_request")),
        (dict(ok, metadata={f"k{i}": "v" for i in range(17)}), (400, "invalid_request")),
        (dict(ok, metadata={"tenant": "x" * 513}), (400, "invalid_request")),
        (dict(ok, metadata={"tenant": 7}), (400, "invalid_json")),
        (dict(ok, agent={"kind": "magic"}), (400, "invalid_request")),
        (dict(ok, agent={"max_steps": 0}), (400, "invalid_request")),
        (dict(ok, bogus=1), (400, "invalid_json")),
        # `repo` may be absent only with `environment_id`.
        ({"task": "no repo"}, (400, "invalid_repo")),
        ({"task": "t", "environment_id": "env_nosuchenvironm1"}, (404, "environment_not_found")),
    ]
    for body, want in cases:
        r = sd.request("POST", "/v1/sessions", body)
        assert err(r) == want, (body, r)
    r = sd.request("POST", "/v1/sessions", raw=b"{}", headers={"Content-Type": "text/plain"})
    assert err(r) == (415, "unsupported_media_type")
    assert sd.request("GET", "/v1/sessions").json()["sessions"] == []
    assert sd.request("GET", "/v1/sessions/ses_aaaaaaaaaaaaaaaa").status == 404
    assert err(sd.request("GET", "/v1/sessions?state=nope")) == (400, "invalid_query")
    assert sd.request("GET", "/v1/sessions", auth=False).status == 401


def test_unfetchable_repo_fails_async_and_log_rules(sd, git_server):
    # Well-formed, but nothing serves it: accepted, then failed with a reason.
    sid = sd.new_session(f"git://127.0.0.1:{git_server.port}/missing.git", "t")
    deadline = time.time() + 120
    while sd.session(sid)["state"] != "failed":
        assert time.time() < deadline
        time.sleep(0.2)
    s = sd.session(sid)
    assert s["reason"].startswith("repo_fetch_failed"), s
    sd.track_sandboxes(sid)
    evs = sd.all_events(sid)
    assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1))
    assert evs[0]["type"] == "session_created" and evs[-1]["type"] == "state_changed"
    assert evs[-1]["to"] == "failed"
    # Fetch start is logged before the fetch; the sandbox is released.
    types = [e["type"] for e in evs]
    assert types.index("repo_fetch_started") < types.index("error") < types.index("sandbox_released")
    # The log ends at the final state: `after` beyond it is refused.
    last = s["last_seq"]
    assert err(sd.request("GET", f"/v1/sessions/{sid}/events?after={last + 1}")) == (400, "after_beyond_end")
    assert sd.events_page(sid, after=last)["events"] == []
    # Finished: messages are 409, cancel is 409 (it did not get cancelled).
    assert err(sd.request("POST", f"/v1/sessions/{sid}/messages", {"text": "hi"})) == (409, "session_state_conflict")
    assert sd.request("POST", f"/v1/sessions/{sid}:cancel").status == 409
    # An SSE reader of a finished session gets everything, then the end.
    got = sse_events(sd.port, sid)
    assert [g[0] for g in got] == list(range(1, last + 1))
    got = sse_events(sd.port, sid, last_event_id=last - 2)
    assert [g[0] for g in got] == [last - 1, last]


def test_idempotency_key(sd, git_server):
    repo = git_server.add_repo("idem", DEMO_FILES)
    body = {"repo": repo, "task": "[script:ask] t", "idempotency_key": "u42-a"}
    r1 = sd.request("POST", "/v1/sessions", body)
    assert r1.status == 201, r1
    r2 = sd.request("POST", "/v1/sessions", body)
    assert r2.status == 200 and r2.json()["session_id"] == r1.json()["session_id"]
    r3 = sd.request("POST", "/v1/sessions", dict(body, task="another"))
    assert err(r3) == (409, "idempotency_conflict")
    assert len(sd.request("GET", "/v1/sessions").json()["sessions"]) == 1
    sid = r1.json()["session_id"]
    c1 = sd.request("POST", f"/v1/sessions/{sid}:cancel")
    assert c1.status == 200 and c1.json()["state"] == "cancelled", c1
    c2 = sd.request("POST", f"/v1/sessions/{sid}/cancel")
    assert c2.status == 200 and c2.json()["state"] == "cancelled"
    sd.track_sandboxes(sid)


def test_open_stream_cap(model, git_server):
    d = SessionDaemon(model.port, extra=["--sessions-max-streams", "3"]).start()
    try:
        repo = git_server.add_repo("cap", DEMO_FILES)
        sid = d.new_session(repo, "[script:ask] wait for me")
        results = []

        def reader():
            results.append(sse_events(d.port, sid, timeout=300))

        threads = [threading.Thread(target=reader) for _ in range(3)]
        for t in threads:
            t.start()
        from harness import metric
        deadline = time.time() + 30
        while metric(d, "hatchery_sessions_open_streams") < 3:
            assert time.time() < deadline
            time.sleep(0.1)
        r = d.request("GET", f"/v1/sessions/{sid}/events", headers={"Accept": "text/event-stream"})
        assert err(r) == (503, "too_many_streams")
        assert r.headers.get("retry-after") == "1" or r.headers.get("Retry-After") == "1"
        # JSON pages are not streams: still fine.
        assert d.request("GET", f"/v1/sessions/{sid}/events").status == 200
        c = d.request("POST", f"/v1/sessions/{sid}:cancel")
        assert c.json()["state"] == "cancelled", c
        for t in threads:
            t.join(60)
        # Every reader got the whole log, ending with the final state.
        for got in results:
            assert got[-1][2]["type"] == "state_changed" and got[-1][2]["to"] == "cancelled"
            assert [g[0] for g in got] == list(range(1, len(got) + 1))
        deadline = time.time() + 10
        while metric(d, "hatchery_sessions_open_streams") > 0:
            assert time.time() < deadline
            time.sleep(0.1)
        d.track_sandboxes(sid)
    finally:
        d.cleanup_sessions()
