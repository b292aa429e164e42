"""Spend that stays bounded whatever the upstream or the caller does
(issue 36): the standalone `hatchery-gateway` in front of a scripted
upstream that lies about usage, stalls and streams slowly, and callers that
hang up at random points. After each: recorded spend is at most the limit
plus one reservation, and no reservation is left to expire uncharged. All
traffic is on 127.0.0.1; every wait is bounded."""

import concurrent.futures
import json
import random
import re
import socket
import time

import pytest

from scripted_upstream import Upstream
from test_gateway import ADMIN, Gateway

MAX_TOKENS = 200


@pytest.fixture
def upstream():
    u = Upstream()
    yield u
    u.close()


@pytest.fixture
def gw(upstream):
    g = Gateway(upstream)
    yield g
    g.stop()


def request(flavor, model, content, stream=False, max_tokens=MAX_TOKENS):
    body = {"model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": content}]}
    if stream:
        body["stream"] = True
    return body


def send(port, flavor, key, body):
    """A call on a raw socket (the caller decides when to hang up)."""
    data = json.dumps(body).encode()
    if flavor == "openai":
        path, auth = "/v1/chat/completions", f"Authorization: Bearer {key}\r\n"
    else:
        path, auth = "/v1/messages", f"x-api-key: {key}\r\nanthropic-version: 2023-06-01\r\n"
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall((f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Content-Type: application/json\r\n"
               f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode() + data)
    return s


def answer(s):
    """Reads a call's whole answer (Connection: close): status and body."""
    out = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        out += b
    s.close()
    head, _, body = out.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def reached(upstream, content):
    """The upstream's record of the one call whose message was `content`."""
    deadline = time.time() + 10
    while time.time() < deadline:
        with upstream.lock:
            hits = [r for r in upstream.requests
                    if content in json.dumps(r["body"]["messages"]) and "reported" in r]
        if hits:
            assert len(hits) == 1, hits
            return hits[0]
        time.sleep(0.02)
    raise AssertionError(f"{content} never reached the upstream")


def reservation(rec):
    # The gateway's estimate of a text-only call: every byte of the body it
    # sent a token, plus max_tokens (docs/gateway.md, "Budgets").
    return rec["size"] + MAX_TOKENS


def metric(gw, name, api):
    st, body = gw.raw("GET", "/metrics", headers={"authorization": f"Bearer {ADMIN}"})
    assert st == 200
    m = re.search(rf'^{name}{{api="{api}"}} (\d+)', body.decode(), re.M)
    return int(m.group(1)) if m else 0


def settled(gw, scope):
    """The scope's budget once its calls settled: a scope without limits
    has a row only from its first settle, which may land just after the
    answer (or well after a caller hung up)."""
    deadline = time.time() + 15
    while True:
        st, b = gw.admin("GET", f"/admin/budgets/{scope}")
        if st == 200 and b["reserved_tokens"] == 0:
            return b
        assert time.time() < deadline, (scope, st, b)
        time.sleep(0.05)


def log(gw):
    gw.log.flush()
    with open(gw.log.name, "rb") as f:
        return f.read().decode(errors="replace")


def test_usage_reported_above_the_reservation_is_an_overage_not_a_charge(gw, upstream):
    """Six calls (whole and streamed, both APIs) whose upstream reports
    5,000 + 5,000 tokens against reservations of about 300, under a tenant
    limit of 4,000 tokens: the first is charged its reservation, the rest
    of its report is an `overage` (log event, metric, and the tenant's
    budget row), and since what the upstream reported has used up the
    tenant, the other five are refused 429 `budget_exhausted` before the
    upstream (before the overage counted: all six went out, the upstream
    billed 60,000; before the charge was capped: 60,000 recorded)."""
    key = gw.key("ses_liar", tenant="acme-liar")
    limit = 4000
    gw.budget("tenant:acme-liar", tokens=limit)
    recs = []
    for i, (flavor, stream) in enumerate([("openai", False), ("anthropic", False), ("openai", True),
                                          ("anthropic", True), ("openai", False), ("anthropic", True)]):
        content = f"<liar call {i}>"
        st, body = answer(send(gw.port, flavor, key, request(flavor, "liar-model", content, stream)))
        if i == 0:
            assert st == 200, body
            recs.append(reached(upstream, content))
            # Its settle lands just after the answer (until then its
            # reservation still counts).
            gw.spent("tenant:acme-liar")
        else:
            assert st == 429, (i, st, body)
            # In the caller's protocol: OpenAI's code, Anthropic's type.
            e = json.loads(body)["error"]
            shapes = (("budget_exhausted", "insufficient_quota"), (None, "rate_limit_error"))
            assert (e.get("code"), e.get("type")) in shapes, (i, body)
            assert "tenant:acme-liar" in e["message"], body
    with upstream.lock:
        assert len(upstream.requests) == 1, "a refused call reached the upstream"
    assert recs[0]["reported"] == (5000, 5000)
    t = gw.spent("tenant:acme-liar")
    charged = reservation(recs[0])
    assert (t["used_tokens"], t["overage_tokens"]) == (charged, 10000 - charged), t
    assert t["used_tokens"] <= limit + charged, t
    assert t["reserved_tokens"] == 0, t
    s = settled(gw, "session:ses_liar")
    assert (s["used_tokens"], s["overage_tokens"]) == (charged, 10000 - charged), s
    over = metric(gw, "hatchery_gateway_overage_tokens_total", "openai") + \
        metric(gw, "hatchery_gateway_overage_tokens_total", "anthropic")
    assert over == 10000 - charged, over
    text = log(gw)
    assert text.count("model call overage") == 1, text[-3000:]
    # What the upstream really used passes the tenant's limit: its budget
    # is gone, which a session is told (standalone: the log line).
    assert "budget exhausted" in text and "tenant:acme-liar" in text


def test_callers_that_hang_up_are_still_settled(gw, upstream):
    """Six whole and six streamed calls (both APIs) to a slow upstream
    (1.6 s an answer, or a stream dripping over about 1.6 s), each caller
    hanging up at a random point between 0.1 and 1 s: every call is settled
    with what the upstream reported (before: whole answers were charged 0,
    their reservation left to expire; streams were charged their
    reservation), and no reservation is left."""
    rng = random.Random(36)
    calls = []
    for i in range(12):
        flavor = "openai" if i % 2 == 0 else "anthropic"
        stream = i >= 6
        session = f"ses_gone{i}"
        content = f"<hang up {i}>"
        s = send(gw.port, flavor, gw.key(session), request(flavor, "drip-model", content, stream))
        calls.append((s, session, content, rng.uniform(0.1, 1.0)))
    start = time.time()
    for s, _, _, after in sorted(calls, key=lambda c: c[3]):
        time.sleep(max(0.0, start + after - time.time()))
        s.close()
    for _, session, content, _ in calls:
        rec = reached(upstream, content)
        b = settled(gw, f"session:{session}")
        assert b["reserved_tokens"] == 0, (session, b)
        assert b["used_tokens"] > 0, (session, b)
        # The upstream finished well within the deadline: what it reported.
        assert b["used_tokens"] == sum(rec["reported"]), (session, b, rec["reported"], reservation(rec))


def test_an_answer_that_does_not_end_in_time_is_charged_its_reservation(upstream):
    """With a reservation TTL of 2 s the answer deadline is 1 s: an upstream
    that takes the request and stalls (whole), and one whose stream does not
    end in time, are each charged the whole reservation when the deadline
    passes, long before the TTL, and the stalled call answers 504."""
    g = Gateway(upstream, ttl=2)
    try:
        t = time.time()
        st, body = answer(send(g.port, "openai", g.key("ses_stuck"), request("openai", "hang-model", "stuck")))
        assert st == 504 and json.loads(body)["error"]["code"] == "upstream_timeout", (st, body)
        assert time.time() - t < 5
        rec = reached_no_report(upstream, "stuck")
        b = settled(g, "session:ses_stuck")
        assert (b["used_tokens"], b["reserved_tokens"]) == (reservation(rec), 0), b
        s = send(g.port, "anthropic", g.key("ses_late"), request("anthropic", "drip-model", "late", True))
        st, _ = answer(s)
        assert st == 200
        rec = reached(upstream, "late")
        b = settled(g, "session:ses_late")
        assert (b["used_tokens"], b["reserved_tokens"]) == (reservation(rec), 0), b
    finally:
        g.stop()


def reached_no_report(upstream, content):
    """A call the upstream took but has not answered (it reports later)."""
    with upstream.lock:
        hits = [r for r in upstream.requests if content in json.dumps(r["body"]["messages"])]
    assert len(hits) == 1, hits
    return hits[0]


def test_concurrent_honest_calls_are_charged_exactly(gw, upstream):
    """Thirty honest calls at once, whole and streamed, both APIs, on one
    session and tenant: the recorded spend is exactly what the upstream
    reported, nothing is left reserved, no overage."""
    key = gw.key("ses_honest", tenant="acme-honest")
    gw.budget("session:ses_honest", tokens=10**9)

    def one(i):
        flavor = "openai" if i % 2 == 0 else "anthropic"
        content = f"<honest {i}>" + "x" * (i * 7)
        st, body = answer(send(gw.port, flavor, key, request(flavor, "gpt-test", content, stream=i % 3 == 0)))
        assert st == 200, body
        return reached(upstream, content)
    with concurrent.futures.ThreadPoolExecutor(30) as ex:
        recs = list(ex.map(one, range(30)))
    b = gw.spent("session:ses_honest")
    assert b["used_tokens"] == sum(sum(r["reported"]) for r in recs), b
    assert b["reserved_tokens"] == 0
    assert settled(gw, "tenant:acme-honest")["used_tokens"] == b["used_tokens"]
    assert "model call overage" not in log(gw)


def test_what_a_body_does_not_bound_is_reserved_or_refused(gw, upstream):
    """An image costs tokens its URL's bytes do not bound: the call reserves
    an image's worst case and, under a 10,000-token budget, is refused
    before the upstream (before: reserved ~150 tokens and sent). A document
    has no bound the gateway can know: 400 `unbounded_input`."""
    key = gw.key("ses_media")
    gw.budget("session:ses_media", tokens=10000)
    img = {"model": "gpt-test", "max_tokens": 16, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "https://example.invalid/a.png"}}]}]}
    st, body = answer(send(gw.port, "openai", key, img))
    assert st == 429 and json.loads(body)["error"]["code"] == "budget_exhausted", (st, body)
    doc = {"model": "claude-test", "max_tokens": 16, "messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "url", "url": "https://example.invalid/a.pdf"}}]}]}
    st, body = answer(send(gw.port, "anthropic", key, doc))
    assert st == 400, (st, body)
    assert "cannot bound" in json.loads(body)["error"]["message"], body
    assert not upstream.requests
