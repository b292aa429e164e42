"""Sessions with the daemon's model gateway and egress proxy, end to end
with real runsc sandboxes and real clients inside them: the reference
agent calls the scripted model only through the in-process gateway (spend
settled onto the session), and installs a package with pip, clones with
git over HTTPS and fetches with curl through the egress proxy, which
checks each connection against the session's pinned policy version. The
metadata address and a port the policy does not allow fail closed and are
logged; a policy edit after a session was created changes nothing for it;
a budget with no room ends the session `failed` (budget_exhausted) before
the upstream sees a call. Every test checks teardown."""

import json
import os
import time

import pytest

from gateway_daemon import gateway_daemon, verify_chain
from egress_servers import HOST, PKG, PKG_VALUE
from scripted_model import ScriptedModel
from sessions_support import DEMO_FILES, SCRIPTS

UPSTREAM_KEY = "sk-upstream-" + os.urandom(6).hex()
PRICES = {"models": {"scripted": {"input_cents_per_mtok": 100000, "output_cents_per_mtok": 400000}}}
CA_PATH = "/workspace/ca.pem"
# Bad requests straight to the proxy from inside the sandbox; prints the
# status line of each answer.
PROBE = r"""
import socket, sys
h = int(sys.argv[1])
bad = [
    b"CONNECT  127.0.0.2:%d HTTP/1.1\r\n\r\n" % h,                  # two spaces
    b"GET http://user:pw@127.0.0.2:%d/ HTTP/1.1\r\nHost: x\r\n\r\n" % h,  # userinfo
    "CONNECT ex\u00e4mple.com:443 HTTP/1.1\r\n\r\n".encode(),            # raw IDN
    b"CONNECT pypi.org.:443 HTTP/1.1\r\n\r\n",                        # trailing dot
    b"CONNECT 2130706434:%d HTTP/1.1\r\n\r\n" % h,                   # 127.0.0.2 in decimal
    b"CONNECT 0177.0.0.2:%d HTTP/1.1\r\n\r\n" % h,                   # octal
    b"CONNECT [::ffff:169.254.169.254]:80 HTTP/1.1\r\n\r\n",         # IPv4-mapped metadata
    b"GET http://127.0.0.2:%d/ HTTP/1.1\r\nX: " % h + b"a" * 20000 + b"\r\n\r\n",  # huge head
]
for req in bad:
    s = socket.create_connection(("127.0.0.1", 3128))
    try:
        s.sendall(req)
    except OSError:
        pass
    data = b""
    while b"\r\n" not in data:
        c = s.recv(4096)
        if not c:
            break
        data += c
    print(data.split(b"\r\n")[0].decode(errors="replace"))
    s.close()
"""
CA_ENV = {"PIP_CERT": CA_PATH, "GIT_SSL_CAINFO": CA_PATH, "CURL_CA_BUNDLE": CA_PATH}


def shell(cmd):
    return {"tool_calls": [{"name": "shell", "arguments": {"command": cmd}}]}


def finish(summary):
    return {"tool_calls": [{"name": "finish", "arguments": {"summary": summary}}]}


@pytest.fixture(scope="module")
def commands(servers):
    p, h, d = servers.https.port, servers.http.port, servers.denied.port
    return {
        "curl": f"curl -sS https://{HOST}:{p}/hello",
        "plain": f"curl -sS http://{HOST}:{h}/plain",
        "pip": (f"pip install -q --no-deps --break-system-packages --target /tmp/pkgs "
                f"--index-url https://{HOST}:{p}/simple/ {PKG} 2>&1 && "
                f"python3 -c 'import sys; sys.path.insert(0, \"/tmp/pkgs\"); import {PKG}; print({PKG}.VALUE)'"),
        "git": f"git clone -q https://{HOST}:{p}/git/lib.git /tmp/lib 2>&1 && cat /tmp/lib/hello.txt",
        "metadata": "curl -s -o /dev/null -w '%{http_code}' http://169.254.169.254/latest/meta-data/",
        "denied": f"curl -s -o /dev/null -w '%{{http_connect}}' https://{HOST}:{d}/; echo \" rc=$?\"",
        "env": "env",
        "probe": f"python3 probe.py {h}",
        # Straight to the gateway (no proxy): over the output cap, refused
        # before the upstream; then a valid call claiming another sandbox,
        # which the relay overwrites (charged to this session).
        "overcap": ("curl -s --noproxy '*' -H 'Content-Type: application/json' -d "
                    "'{\"model\": \"scripted\", \"max_tokens\": 999999, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}' "
                    "http://127.0.0.1:9100/v1/chat/completions"),
        "forged": ("curl -s --noproxy '*' -H 'X-Hatchery-Sandbox: sbx_someoneelse' -H 'Content-Type: application/json' -d "
                   "'{\"model\": \"scripted\", \"max_tokens\": 16, \"messages\": [{\"role\": \"user\", \"content\": \"[script:broke] x\"}]}' "
                   "-o /dev/null -w '%{http_code}' http://127.0.0.1:9100/v1/chat/completions"),
    }


@pytest.fixture(scope="module")
def model(commands):
    scripts = {
        "net": [shell(commands[k]) for k in
                ("curl", "plain", "pip", "git", "metadata", "denied", "env", "overcap", "forged", "probe")]
        + [finish("installed, cloned, fetched")],
        "after-edit": [shell(commands["curl"]), finish("tried")],
        "move": [shell(commands["curl"]), {"content": "ready for a policy move"}, shell(commands["curl"]),
                 finish("moved")],
        "restart": [shell("sleep 8; " + commands["curl"]), finish("survived")],
        "held": [dict(shell("true"), delay_s=HELD_S), finish("never")],
        "broke": [finish("never reached")],
        # Its model reports 100,000 + 100,000 tokens for the first call.
        "overreport": [dict(shell("echo hi"), usage={"prompt_tokens": 100000, "completion_tokens": 100000}),
                       finish("done")],
        # 150 denied requests through the proxy from one process, then a
        # pause. One curl process per request was too slow in one CI run
        # (about 5 started a second in the sandbox).
        "flood": [shell(f"python3 -c \"{flood_py(commands_port(commands))}\"; "
                        "sleep 2.5; echo flooded"), finish("flooded")],
        # The sessions demo (fix the failing test), after installing a
        # package through the proxy.
        "demo": [shell(commands["pip"])] + SCRIPTS["fix"],
    }
    m = ScriptedModel(scripts).start()
    yield m
    m.stop()


@pytest.fixture
def gd(model, agent_templates):
    """A daemon whose gateway forwards to the scripted model; no other
    host service: the model is reachable only through the gateway."""
    with gateway_daemon(model, agent_templates, "hxgwp-", prices=PRICES, upstream_key=UPSTREAM_KEY) as d:
        yield d


FLOOD = 150
# How long the scripted model holds the "held" script's first call.
HELD_S = 30


def commands_port(commands):
    """The port no rule allows, from the `denied` command."""
    return commands["denied"].split(f"https://{HOST}:")[1].split("/")[0]


def test_a_flood_of_denials_is_counted(gd, servers, git_server):
    pol = egress_policy(gd, servers)
    repo = git_server.add_repo("flood", {**DEMO_FILES, "ca.pem": servers.ca_pem})
    sid = gd.new_session(repo, "[script:flood] flood", policy_id=pol["id"],
                         template="agent-session", env=CA_ENV)
    gd.wait_state(sid, "completed", timeout=300)
    gd.track_sandboxes(sid)
    evs = gd.all_events(sid)
    assert outputs(evs)[0].strip() == "flooded", outputs(evs)
    # Every denial is in the log, in the count of an `egress_denied` event
    # for its destination (one at once, the rest at the interval's end or
    # when the sandbox is released); test_egress_intent.py floods 10,000.
    denied = wait_denied(gd, sid, FLOOD)
    assert sum(e["count"] for e in denied) == FLOOD, [e["count"] for e in denied]
    assert 1 <= len(denied) <= 3, [e["count"] for e in denied]
    assert all(e["status"] == 403 for e in denied)
    assert servers.hits["denied"] == []
    text = gd.request("GET", "/metrics").body.decode()
    assert f"hatchery_egress_denied_coalesced_total {FLOOD - len(denied)}" in text


def wait_denied(d, sid, total, timeout=15):
    """The session's `egress_denied` events once their counts reach
    `total`: the last counts are written when the sandbox is released,
    which may be just after the session's final state."""
    deadline = time.time() + timeout
    while True:
        denied = [e for e in d.all_events(sid) if e["type"] == "egress_denied"]
        if sum(e["count"] for e in denied) >= total or time.time() > deadline:
            return denied
        time.sleep(0.2)


def egress_policy(d, servers, rules=None):
    allow = [{"id": "test-servers", "effect": "allow",
              "match": {"tools": ["egress"], "hosts": [f"{HOST}/32"],
                        "ports": [servers.https.port, servers.http.port]}}]
    r = d.request("POST", "/v1/policies", {"name": "egress-test", "rules": rules or allow})
    assert r.status == 201, r
    return r.json()


def flood_py(port):
    """FLOOD requests to a denied address, through the proxy the session's
    environment names (urllib reads HTTP_PROXY), one after another."""
    return ("import urllib.request as u\n"
            f"for i in range({FLOOD}):\n"
            "    try: u.urlopen('http://" + f"{HOST}:{port}/', timeout=10)\n"
            "    except Exception: pass\n")


def outputs(evs):
    return [e["output"] for e in evs if e["type"] == "command_run"]


def test_session_uses_gateway_and_proxy(gd, servers, git_server, model, commands):
    pol = egress_policy(gd, servers)
    repo = git_server.add_repo("net", {**DEMO_FILES, "ca.pem": servers.ca_pem, "probe.py": PROBE})
    before = len(model.requests)
    sid = gd.new_session(repo, "[script:net] install, clone, fetch", policy_id=pol["id"],
                         template="agent-session", env=CA_ENV, budget={"tokens": 200000, "wall_s": 600})
    assert gd.session(sid)["policy_version"] == 1
    # Edited after the session was created: the session stays on version 1.
    deny_all = [{"id": "nothing", "effect": "deny", "match": {"tools": ["egress"]}}]
    r = gd.request("POST", f"/v1/policies/{pol['id']}/versions", {"name": "egress-test", "rules": deny_all})
    assert r.status in (200, 201), r
    s = gd.wait_state(sid, "completed", timeout=300)
    gd.track_sandboxes(sid)
    evs = gd.all_events(sid)
    out = outputs(evs)
    assert out[0].strip() == "hello through the proxy", out
    assert out[1].strip() == "plain http through the proxy", out
    assert out[2].strip().endswith(PKG_VALUE), out[2]
    assert out[3].strip() == "cloned over https", out[3]
    assert out[4].strip() == "403", out[4]
    assert out[5].strip() == "403 rc=56", out[5]
    # No key of any kind in the agent's environment; the proxy settings are.
    env = out[6]
    assert UPSTREAM_KEY not in env and f"HTTPS_PROXY=http://127.0.0.1:3128" in env, env
    assert "GIT_CONFIG_KEY_0=http.proxy" in env and "PIP_PROXY=" in env
    assert "max_tokens_over_cap" in out[7], out[7]
    assert out[8].strip() == "200", out[8]
    refused = [e for e in evs if e["type"] == "model_refused"]
    assert [e["code"] for e in refused] == ["max_tokens_over_cap"], refused

    allowed = [e for e in evs if e["type"] == "egress_connect"]
    assert allowed and all(e["host"] == HOST and e["rule_id"] == "test-servers" and e["decision"] == "allow"
                           for e in allowed), allowed
    assert {e["port"] for e in allowed} == {servers.https.port, servers.http.port}
    results = [e for e in evs if e["type"] == "egress_result"]
    assert {e["connect_seq"] for e in results} == {e["seq"] for e in allowed}, (results, allowed)
    assert all(e["outcome"] == "connected" for e in results), results
    # The metadata address, the port no rule allows, the probes: each
    # refused and counted under its destination and status.
    denied = wait_denied(gd, sid, 10)
    counted = {}
    for e in denied:
        k = (e.get("host"), e.get("port"), e["status"])
        counted[k] = counted.get(k, 0) + e["count"]
    meta = next(e for e in denied if e.get("host") == "169.254.169.254")
    assert (meta.get("port"), meta["status"], meta["count"]) == (80, 403, 1), denied
    port = next(e for e in denied if e.get("port") == servers.denied.port)
    assert (port["status"], port.get("rule_id"), port["count"]) == (403, None, 1), denied
    # Bad input: each refused with a clear status and counted, none dialled.
    lines = out[9].strip().splitlines()
    assert [ln.split(" ")[1] for ln in lines] == ["400"] * 6 + ["403", "431"], lines
    assert counted[(None, None, 400)] == 6 and counted[(None, None, 431)] == 1, counted
    assert sum(counted.values()) == 10, counted
    assert servers.hits["denied"] == [] and servers.hits["http"] == [("GET", "/plain")]
    # pip fetched the index and the wheel; git ran the smart protocol.
    paths = [p for _, p in servers.hits["https"]]
    assert f"/simple/{PKG}/" in paths and any(p.startswith("/packages/") for p in paths)
    assert any("git-upload-pack" in p for p in paths)

    # Model calls went through the gateway only, and are the spend.
    calls = [e for e in evs if e["type"] == "model_call"]
    # 11 agent steps and the forged-header call, charged here.
    assert len(calls) == 12 and all(c["model"] == "scripted" and c["api"] == "openai" for c in calls)
    assert s["spend"]["tokens"] == sum(c["tokens"] for c in calls) > 0
    assert s["spend"]["usd_cents"] == sum(c["usd_cents"] for c in calls) > 0
    seen = model.requests[before:]
    assert len(seen) == 12
    assert not any(r["body"].get("max_tokens") == 999999 for r in seen)
    # The relay's sandbox header stops at the gateway.
    assert all(r["sandbox"] is None for r in seen)

    # A new session gets version 2, which denies everything.
    sid2 = gd.new_session(repo, "[script:after-edit] try again", policy_id=pol["id"],
                          template="agent-session", env=CA_ENV)
    assert gd.session(sid2)["policy_version"] == 2
    gd.wait_state(sid2, "completed", timeout=300)
    gd.track_sandboxes(sid2)
    evs2 = gd.all_events(sid2)
    assert "403" in outputs(evs2)[0] or "CONNECT" in outputs(evs2)[0], outputs(evs2)
    eg2 = [e for e in evs2 if e["type"].startswith("egress")]
    assert len(eg2) == 1 and eg2[0]["type"] == "egress_denied" and eg2[0]["rule_id"] == "nothing", eg2
    assert eg2[0]["count"] == 1


def test_exhausted_budget_fails_the_session_before_the_upstream(gd, git_server, model):
    repo = git_server.add_repo("broke", DEMO_FILES)
    before = len(model.requests)
    # A call reserves its prompt plus the 4096-token output cap: 1000 fits none.
    sid = gd.new_session(repo, "[script:broke] no budget", template="agent-session",
                         budget={"tokens": 1000, "wall_s": 600})
    t0 = time.time()
    while time.time() - t0 < 300:
        s = gd.session(sid)
        if s["state"] in ("completed", "failed", "cancelled"):
            break
        time.sleep(0.3)
    assert s["state"] == "failed" and s["reason"].startswith("budget_exhausted"), s
    gd.track_sandboxes(sid)
    evs = gd.all_events(sid)
    ex = [e for e in evs if e["type"] == "budget_exhausted"]
    assert len(ex) == 1 and ex[0]["scope"] == f"session:{sid}", evs
    assert not any(e["type"] == "model_call" for e in evs)
    assert s["spend"]["tokens"] == 0
    assert len(model.requests) == before, "the upstream saw a call it had no budget for"


def test_an_upstream_reporting_more_than_reserved_fails_the_session(gd, git_server, model):
    """The model reports 100,000 + 100,000 tokens for a call that reserved
    its prompt plus the 4096-token output cap: the session is charged the
    reservation, not the report (its spend stays within its 50,000-token
    limit), and since what the upstream really used is past the limit the
    session ends `failed` (budget_exhausted). Before: charged 200,000."""
    repo = git_server.add_repo("overreport", DEMO_FILES)
    limit = 50000
    sid = gd.new_session(repo, "[script:overreport] lie", template="agent-session",
                         budget={"tokens": limit, "wall_s": 600})
    t0 = time.time()
    while time.time() - t0 < 300:
        s = gd.session(sid)
        if s["state"] in ("completed", "failed", "cancelled"):
            break
        time.sleep(0.3)
    gd.track_sandboxes(sid)
    evs = gd.all_events(sid)
    calls = [e for e in evs if e["type"] == "model_call"]
    assert calls and calls[0]["input_tokens"] == 100000 and calls[0]["output_tokens"] == 100000, evs
    assert calls[0]["tokens"] < 20000, calls[0]
    assert s["state"] == "failed" and s["reason"].startswith("budget_exhausted"), s
    ex = [e for e in evs if e["type"] == "budget_exhausted"]
    assert len(ex) == 1 and ex[0]["scope"] == f"session:{sid}", evs
    assert s["spend"]["tokens"] == sum(c["tokens"] for c in calls) <= limit, s


def test_bindings_survive_a_daemon_sigkill(gd, servers, git_server, model):
    """The proxy's sandbox-to-session map is in memory: a restarted daemon
    re-binds when its runner re-attaches, and the session goes on."""
    pol = egress_policy(gd, servers)
    repo = git_server.add_repo("restart", {**DEMO_FILES, "ca.pem": servers.ca_pem})
    sid = gd.new_session(repo, "[script:restart] survive", policy_id=pol["id"],
                         template="agent-session", env=CA_ENV)
    gd.wait_event(sid, "tool_call")
    gd.track_sandboxes(sid)
    gd.crash()
    gd.start()
    s = gd.wait_state(sid, "completed", timeout=300)
    evs = gd.all_events(sid)
    assert outputs(evs)[0].strip() == "hello through the proxy", outputs(evs)
    eg = [e["type"] for e in evs if e["type"].startswith("egress")]
    assert eg == ["egress_connect", "egress_result"], eg
    calls = [e for e in evs if e["type"] == "model_call"]
    assert len(calls) == 2 and s["spend"]["tokens"] == sum(c["tokens"] for c in calls)


def test_a_model_call_at_the_upstream_when_the_daemon_dies_was_logged_first(agent_templates, git_server, model):
    """SIGKILL while a call is at the upstream (the scripted model holds it
    for HELD_S s): its `model_call_intent` is already in the session's log
    (committed before the upstream was dialled), with no `model_call` after
    it, and the upstream saw exactly as many calls as there are intents.
    Its reservation outlives the call: once its TTL (15 s here) passes the
    restarted daemon's janitor charges it whole (the upstream may have
    billed it), as `model_call_expired` on the session's spend, so the
    budget never gets that room back. The log still verifies."""
    with gateway_daemon(model, agent_templates, "hxgwh-", prices=PRICES, upstream_key=UPSTREAM_KEY,
                        extra=["--gateway-reservation-ttl", "15"]) as gd:
        repo = git_server.add_repo("held", DEMO_FILES)
        before = len(model.requests)
        sid = gd.new_session(repo, "[script:held] a call held at the upstream", template="agent-session")
        gd.track_sandboxes(sid)
        intent = gd.wait_event(sid, "model_call_intent", timeout=120)
        deadline = time.time() + 30
        while len(model.requests) == before and time.time() < deadline:
            time.sleep(0.05)
        assert len(model.requests) - before == 1, "the upstream never saw the call"
        gd.crash()
        gd.start()
        evs = gd.all_events(sid)
        intents = [e for e in evs if e["type"] == "model_call_intent"]
        assert intents and intents[0]["reservation"] == intent["reservation"], evs
        assert not [e for e in evs if e["type"] == "model_call" and e["seq"] > intent["seq"]
                    and e["seq"] < (intents[1]["seq"] if len(intents) > 1 else 1 << 62)], evs
        # The unsettled call is charged whole once its reservation expires.
        expired = None
        deadline = time.time() + 60
        while expired is None and time.time() < deadline:
            expired = next((e for e in gd.all_events(sid) if e["type"] == "model_call_expired"
                            and e["reservation"] == intent["reservation"]), None)
            time.sleep(0.5)
        assert expired is not None, [e["type"] for e in gd.all_events(sid)]
        assert expired["tokens"] == intent["reserved_tokens"] > 0, (expired, intent)
        assert gd.session(sid)["spend"]["tokens"] >= expired["tokens"]
        # Whatever the restarted session did next, no call reached the
        # upstream without its intent.
        assert gd.request("POST", f"/v1/sessions/{sid}:cancel").status == 200
        gd.wait_state(sid, "cancelled", timeout=120)
        evs = gd.all_events(sid)
        intents = [e for e in evs if e["type"] == "model_call_intent"]
        assert len(model.requests) - before <= len(intents), (len(model.requests) - before, intents)
        assert len([e for e in evs if e["type"] == "model_call_expired"]) == 1, evs
        verify_chain(gd, sid)


def test_demo_installs_through_the_proxy_and_spends_through_the_gateway(gd, servers, git_server, model):
    """The agent-sessions demo with the gateway and the proxy: the agent
    installs a package through the proxy, then fixes the failing test; every
    model call goes through the gateway and the spend is on the session."""
    pol = egress_policy(gd, servers)
    repo = git_server.add_repo("demo", {**DEMO_FILES, "ca.pem": servers.ca_pem})
    before = len(model.requests)
    sid = gd.new_session(repo, "[script:demo] The test in test_calc.py fails. Make it pass.",
                         policy_id=pol["id"], template="agent-session", env=CA_ENV)
    s = gd.wait_state(sid, "completed", timeout=300)
    gd.track_sandboxes(sid)
    assert s["reason"] == "agent finished: fixed add(); tests pass"
    evs = gd.all_events(sid)
    runs = [e for e in evs if e["type"] == "command_run"]
    assert runs[0]["output"].strip().endswith(PKG_VALUE), runs[0]
    assert runs[1]["exit_code"] != 0 and runs[2]["exit_code"] == 0
    assert any(e["type"] == "egress_connect" for e in evs)
    calls = [e for e in evs if e["type"] == "model_call"]
    assert len(calls) == len(model.requests) - before == 6
    # Each call's intent came first: 6 intents, the i-th before the i-th call.
    intents = [e for e in evs if e["type"] == "model_call_intent"]
    assert len(intents) == 6 and all(i["seq"] < c["seq"] for i, c in zip(intents, calls)), intents
    assert len({i["reservation"] for i in intents}) == 6
    assert all(i["reserved_tokens"] >= c["tokens"] for i, c in zip(intents, calls)), (intents, calls)
    assert s["spend"]["tokens"] == sum(c["tokens"] for c in calls) > 0
    assert s["spend"]["usd_cents"] == sum(c["usd_cents"] for c in calls) > 0
    budgets = [e for e in evs if e["type"] == "budget"]
    assert budgets[-1]["tokens"] == s["spend"]["tokens"]
    r = gd.request("GET", "/metrics")
    text = r.body.decode()
    assert 'hatchery_egress_connections_total{status="200",verdict="allowed"}' in text, text[-2000:]
    assert 'hatchery_gateway_calls_total{api="openai",outcome="ok"} 6' in text, text[-2000:]


def test_moving_a_session_to_a_new_version_applies_to_new_connections(gd, servers, git_server):
    pol = egress_policy(gd, servers)
    repo = git_server.add_repo("move", {**DEMO_FILES, "ca.pem": servers.ca_pem})
    sid = gd.new_session(repo, "[script:move] fetch, wait, fetch", policy_id=pol["id"],
                         template="agent-session", env=CA_ENV)
    gd.wait_event(sid, "waiting")
    deny_all = [{"id": "nothing", "effect": "deny", "match": {"tools": ["egress"]}}]
    r = gd.request("POST", f"/v1/policies/{pol['id']}/versions", {"name": "egress-test", "rules": deny_all})
    assert r.status in (200, 201), r
    assert gd.session(sid)["policy_version"] == 1
    assert gd.request("POST", f"/v1/sessions/{sid}/policy", {"version": 3}).status == 400
    assert gd.request("POST", f"/v1/sessions/{sid}/policy", {"version": "x"}).status == 400
    assert gd.request("POST", "/v1/sessions/ses_nope/policy", {}).status == 404
    r = gd.request("POST", f"/v1/sessions/{sid}/policy", {})
    assert r.status == 200 and r.json()["policy_version"] == 2, r
    assert gd.request("POST", f"/v1/sessions/{sid}/messages", {"text": "go"}).status == 202
    s = gd.wait_state(sid, "completed", timeout=300)
    gd.track_sandboxes(sid)
    evs = gd.all_events(sid)
    out = outputs(evs)
    assert out[0].strip() == "hello through the proxy" and "403" in out[1], out
    moved = [e for e in evs if e["type"] == "policy_moved"]
    assert len(moved) == 1 and (moved[0]["from_version"], moved[0]["to_version"]) == (1, 2)
    assert moved[0]["actor"] == "user"
    eg = [e for e in evs if e["type"] in ("egress_connect", "egress_denied")]
    assert [(e["type"], e.get("rule_id")) for e in eg] == [("egress_connect", "test-servers"),
                                                           ("egress_denied", "nothing")], eg
    assert eg[0]["seq"] < moved[0]["seq"] < eg[1]["seq"]
    assert eg[0]["policy_version"] == 1
    assert s["policy_version"] == 2
    # Finished sessions stay where they ended.
    assert gd.request("POST", f"/v1/sessions/{sid}/policy", {"version": 1}).status == 409


def test_the_pinned_policy_decides_a_model_call_before_the_upstream(gd, git_server, model):
    """Issue 36: the gateway asks the session's pinned policy about each
    model call, with its estimated cost, before reserving or calling the
    upstream. A policy that denies model calls costing more than 1 cent:
    the agent's first call is refused 403 policy_denied (a `model_refused`
    event naming the rule), the upstream never sees it, nothing is spent."""
    r = gd.request("POST", "/v1/policies", {"name": "cheap-models-only", "rules": [
        {"id": "pricey-model-call", "effect": "deny",
         "match": {"tools": ["model_call"], "cost": {"op": "gt", "value": 1}}},
        {"id": "rest", "effect": "allow"}]})
    assert r.status == 201, r
    repo = git_server.add_repo("policy-model", DEMO_FILES)
    before = len(model.requests)
    sid = gd.new_session(repo, "[script:broke] refused", policy_id=r.json()["id"], template="agent-session",
                         budget={"tokens": 50000, "wall_s": 600})
    t0 = time.time()
    while time.time() - t0 < 300:
        s = gd.session(sid)
        if s["state"] in ("completed", "failed", "cancelled"):
            break
        time.sleep(0.3)
    gd.track_sandboxes(sid)
    evs = gd.all_events(sid)
    refused = [e for e in evs if e["type"] == "model_refused"]
    assert refused and refused[0]["code"] == "policy_denied", evs
    assert "pricey-model-call" in refused[0]["message"], refused
    assert not any(e["type"] == "model_call" for e in evs)
    assert s["spend"]["tokens"] == 0, s
    assert len(model.requests) == before, "the upstream saw a call the policy denied"
