"""The model gateway (crates/hatchery-gateway) driven by the real `openai`
and `anthropic` Python clients, in front of a scripted upstream. All traffic
is on 127.0.0.1; every loop is bounded."""

import atexit
import concurrent.futures
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import anthropic
import openai
import pytest

from scripted_upstream import Upstream

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../pg"))
from pg import Postgres, free_port  # noqa: E402

BIN = os.path.join(os.environ.get("HATCHERY_BIN_DIR", os.path.join(os.path.dirname(__file__), "../../target/release")),
                   "hatchery-gateway")
ADMIN = "admin-key-for-the-gateway-tests"
REAL_KEY = "sk-upstream-real-key-0123456789"
PRICES = {"models": {"gpt-test": {"input_cents_per_mtok": 100000, "output_cents_per_mtok": 400000},
                     "slow-model": {"input_cents_per_mtok": 100000, "output_cents_per_mtok": 400000},
                     "claude-test": {"input_cents_per_mtok": 100000, "output_cents_per_mtok": 400000},
                     "full-model": {"input_cents_per_mtok": 100000, "output_cents_per_mtok": 400000},
                     # The scripted upstream lies, stalls and drips for these (test_spend_bounded.py).
                     "liar-model": {"input_cents_per_mtok": 100000, "output_cents_per_mtok": 400000},
                     "hang-model": {"input_cents_per_mtok": 100000, "output_cents_per_mtok": 400000},
                     "drip-model": {"input_cents_per_mtok": 100000, "output_cents_per_mtok": 400000}}}
CAP = 256


class Gateway:
    def __init__(self, upstream, ttl=300, db_dir=None, extra=(), db=None):
        self.dir = db_dir or tempfile.mkdtemp(prefix="hxgw-")
        if db_dir is None:
            # Removed when the run ends, not at stop(): tests restart a
            # gateway on its directory.
            atexit.register(shutil.rmtree, self.dir, True)
        self.extra = list(extra)
        self.db = db or os.path.join(self.dir, "gw.db")
        self.upstream = upstream
        self.ttl = ttl
        open(os.path.join(self.dir, "prices.json"), "w").write(json.dumps(PRICES))
        open(os.path.join(self.dir, "upstream_key"), "w").write(REAL_KEY)
        self.start()

    def start(self):
        self.port = free_port()
        # A TLS upstream test sets `scheme` (and a CA through `extra`).
        up = f"{getattr(self, 'scheme', 'http')}://127.0.0.1:{self.upstream.port}"
        self.log = open(os.path.join(self.dir, "gateway.log"), "ab")
        self.proc = subprocess.Popen(
            [BIN, "--listen", f"127.0.0.1:{self.port}", "--db", self.db,
             "--openai-upstream", up, "--anthropic-upstream", up,
             "--upstream-key-file", os.path.join(self.dir, "upstream_key"),
             "--prices", os.path.join(self.dir, "prices.json"), "--max-output-tokens", str(CAP),
             "--max-body-bytes", str(64 << 10), "--reservation-ttl-seconds", str(self.ttl), *self.extra],
            env=dict(os.environ, HATCHERY_GATEWAY_ADMIN_KEY=ADMIN), stdout=self.log, stderr=self.log)
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                if self.raw("GET", "/healthz")[0] == 200:
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("gateway did not start")

    def raw(self, method, path, body=None, headers=None, timeout=30):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        c.request(method, path, body=data, headers=dict({"content-type": "application/json"}, **(headers or {})))
        r = c.getresponse()
        out = (r.status, r.read())
        c.close()
        return out

    def admin(self, method, path, body=None):
        st, b = self.raw(method, path, body, {"authorization": f"Bearer {ADMIN}"})
        return st, json.loads(b or b"null")

    def key(self, session, tenant=None):
        st, b = self.admin("POST", "/admin/keys", {"session": session, "tenant": tenant})
        assert st == 201, b
        return b["key"]

    def budget(self, scope, **limits):
        st, b = self.admin("PUT", f"/admin/budgets/{scope}", limits)
        assert st == 200, b
        return b

    def spent(self, scope, settled=True):
        """The scope's budget; with `settled`, once no reservation is left
        (calls settle just after they answer)."""
        deadline = time.time() + 10
        while True:
            st, b = self.admin("GET", f"/admin/budgets/{scope}")
            assert st == 200, b
            if not settled or b["reserved_tokens"] == 0 or time.time() > deadline:
                return b
            time.sleep(0.02)

    def openai(self, key):
        return openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key=key, max_retries=0, timeout=30)

    def anthropic(self, key):
        return anthropic.Anthropic(base_url=f"http://127.0.0.1:{self.port}", api_key=key, max_retries=0,
                                   timeout=30)

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


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


def test_openai_client_whole_and_streamed_with_the_real_key_only_upstream(gw, upstream):
    key = gw.key("ses_a", tenant="acme")
    gw.budget("session:ses_a", tokens=100000, usd_cents=100000)
    c = gw.openai(key)
    r = c.chat.completions.create(model="gpt-test", max_tokens=16,
                                  messages=[{"role": "user", "content": "say hello"}])
    assert r.choices[0].message.content.startswith("hello")
    used = r.usage.prompt_tokens + r.usage.completion_tokens
    parts = [ch.choices[0].delta.content for ch in c.chat.completions.create(
        model="gpt-test", max_tokens=16, stream=True, messages=[{"role": "user", "content": "again"}])
        if ch.choices and ch.choices[0].delta.content]
    assert "".join(parts).strip().startswith("hello")
    # What reached the upstream: the gateway's key, never the caller's.
    for req in upstream.requests:
        assert req["headers"]["authorization"] == f"Bearer {REAL_KEY}"
        assert key not in json.dumps(req)
    assert upstream.requests[1]["body"]["stream_options"] == {"include_usage": True}
    b = gw.spent("session:ses_a")
    streamed = upstream.requests[1]
    assert b["reserved_tokens"] == 0
    # Spend = what the upstream reported for both calls (its usage rule:
    # body bytes // 8 in, 7 out).
    stream_in = max(1, len(json.dumps(streamed["body"], separators=(",", ":"))) // 8)
    assert abs(b["used_tokens"] - (used + stream_in + 7)) <= 2, b
    # The tenant has no limits (unlimited) but its spend is recorded too.
    t = gw.spent("tenant:acme")
    assert t["limit_tokens"] is None and t["used_tokens"] == b["used_tokens"], t


def test_anthropic_client_whole_and_streamed(gw, upstream):
    key = gw.key("ses_b")
    c = gw.anthropic(key)
    m = c.messages.create(model="claude-test", max_tokens=32, messages=[{"role": "user", "content": "hi"}])
    assert m.content[0].text.startswith("hello") and m.usage.output_tokens == 7
    with c.messages.stream(model="claude-test", max_tokens=32, messages=[{"role": "user", "content": "hi"}]) as s:
        text = "".join(s.text_stream)
    assert text.startswith("hello")
    for req in upstream.requests:
        assert req["headers"]["x-api-key"] == REAL_KEY and "authorization" not in req["headers"]
    b = gw.spent("session:ses_b")
    assert b["used_tokens"] > 14 and b["reserved_tokens"] == 0, b


def test_50_concurrent_calls_never_overspend_a_budget_that_fits_10(gw, upstream):
    overspend_check(gw, upstream)


def test_the_same_on_postgresql(upstream):
    """The gateway with its budgets on PostgreSQL (a private server from the
    Debian package, tests/pg/pg.py): the same 20 x 50 race, and a restart
    that finds the spend where it left it."""
    with Postgres() as pg:
        g = Gateway(upstream, db=pg.dsn)
        try:
            overspend_check(g, upstream, reps=10)
            before = g.spent("session:ses_c0")
            g.stop()
            g.start()
            assert g.spent("session:ses_c0") == before
        finally:
            g.stop()


def overspend_check(gw, upstream, reps=20):
    # Each call's worst case: body bytes (about 110) + max_tokens 100. A
    # token limit of 10 reservations' worth lets about 10 in at once. The
    # upstream (`full-*`) reports usage as large as that worst case, so an
    # admitted call spends about what it reserved: without reservations, 50
    # concurrent calls would all pass a "used < limit" check and spend 5x.
    body_msgs = [{"role": "user", "content": "x" * 40}]
    admitted, seen = 0, len(upstream.requests)
    for rep in range(reps):
        s = f"ses_c{rep}"
        key = gw.key(s)
        probe = json.dumps({"model": "full-model", "max_tokens": 100, "messages": body_msgs}).encode()
        per_call = len(probe) + 100 + 16
        limit = per_call * 10
        gw.budget(f"session:{s}", tokens=limit)
        c = gw.openai(key)
        before = len(upstream.requests)

        def one(_):
            try:
                c.chat.completions.create(model="full-model", max_tokens=100, messages=body_msgs)
                return "ok"
            except openai.RateLimitError as e:
                assert e.body["code"] == "budget_exhausted", e.body
                return "refused"
        with concurrent.futures.ThreadPoolExecutor(50) as ex:
            outcomes = list(ex.map(one, range(50)))
        c.close()
        b = gw.spent(f"session:{s}")
        reached = upstream.requests[before:]
        reported = sum(r["size"] + 100 for r in reached)
        ok = outcomes.count("ok")
        # What the upstream reported is what the budget counts, and each
        # call reported close to its reservation (the check below bites).
        assert b["used_tokens"] == reported, (rep, b, reported)
        assert reported >= ok * per_call * 0.8, (reported, ok, per_call)
        # The invariant: spend never passes the limit by more than the
        # largest single reservation (here every reservation is per_call).
        assert b["used_tokens"] <= limit + per_call, (rep, b)
        assert b["reserved_tokens"] == 0, b
        # Exactly the calls the limit fits were admitted (10, or 11 if the
        # actual spend left room for one more), every other one refused.
        assert 10 <= ok <= 11 and outcomes.count("refused") == 50 - ok, outcomes
        assert len(reached) == ok
        admitted += ok
    # Refused calls never reached the upstream.
    assert len(upstream.requests) - seen == admitted


def test_a_reservation_left_by_a_crash_is_charged_whole_by_the_janitor(upstream):
    """The upstream had the call when the gateway died: it may have billed
    it, so the janitor charges the reservation whole rather than give the
    budget that room back."""
    g = Gateway(upstream, ttl=2)
    try:
        key = g.key("ses_k")
        g.budget("session:ses_k", tokens=100000)
        c = g.openai(key)
        pool = concurrent.futures.ThreadPoolExecutor(1)
        fut = pool.submit(lambda: c.chat.completions.create(model="slow-model", max_tokens=50,
                                                            messages=[{"role": "user", "content": "wait"}]))
        assert upstream.arrived.wait(10)
        held = g.spent("session:ses_k", settled=False)
        assert held["reserved_tokens"] > 0 and held["used_tokens"] == 0, held
        g.kill()  # between reserve and settle
        with pytest.raises(openai.APIConnectionError):
            fut.result(30)
        pool.shutdown()
        g.start()
        deadline = time.time() + 15
        while time.time() < deadline and g.spent("session:ses_k", settled=False)["reserved_tokens"] > 0:
            time.sleep(0.2)
        after = g.spent("session:ses_k", settled=False)
        assert after["reserved_tokens"] == 0, after
        assert after["used_tokens"] == held["reserved_tokens"], (after, held)
    finally:
        g.stop()


def test_bad_calls_are_refused_before_the_upstream(gw, upstream):
    key = gw.key("ses_d")
    c = gw.openai(key)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="gpt-test", max_tokens=CAP + 1, messages=[{"role": "user", "content": "x"}])
    assert e.value.body["code"] == "max_tokens_over_cap"
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    assert e.value.body["code"] == "unknown_model"
    with pytest.raises(openai.AuthenticationError):
        gw.openai("hxg_not_a_key").chat.completions.create(model="gpt-test",
                                                           messages=[{"role": "user", "content": "x"}])
    with pytest.raises(anthropic.BadRequestError):
        gw.anthropic(key).messages.create(model="claude-test", max_tokens=CAP * 10,
                                          messages=[{"role": "user", "content": "x"}])
    st, b = gw.raw("POST", "/v1/chat/completions", b"x" * (65 << 10), {"authorization": f"Bearer {key}"})
    assert st == 413 and json.loads(b)["error"]["code"] == "request_too_large"
    st, b = gw.raw("POST", "/v1/messages", {"model": "claude-test", "messages": []}, {"x-api-key": key})
    assert st == 400 and json.loads(b)["type"] == "error", b
    st, b = gw.raw("POST", "/v1/chat/completions", b"[1]", {"authorization": f"Bearer {key}"})
    assert st == 400
    assert upstream.requests == [], "nothing refused reached the upstream"
    # A call without max_tokens gets the cap set on its way upstream.
    c.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "x"}])
    assert upstream.requests[-1]["body"]["max_tokens"] == CAP


def test_admin_routes_need_the_admin_key_and_valid_scopes(gw):
    assert gw.raw("PUT", "/admin/budgets/session:x", {"tokens": 1})[0] == 401
    assert gw.raw("POST", "/admin/keys", {"session": "x"}, {"authorization": "Bearer wrong"})[0] == 401
    for scope in ["user:x", "session:", "session:a%20b"]:
        st, b = gw.admin("PUT", f"/admin/budgets/{scope}", {"tokens": 1})
        assert st == 400 and b["error"]["code"] == "invalid_request", (scope, b)
    st, b = gw.admin("PUT", "/admin/budgets/session:x", {"tokens": -1})
    assert st == 400
    st, b = gw.admin("GET", "/admin/budgets/session:never")
    assert st == 404 and b["error"]["code"] == "not_found"
    st, b = gw.admin("POST", "/admin/keys", {"session": "a/b"})
    assert st == 400
