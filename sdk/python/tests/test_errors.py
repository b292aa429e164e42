import os
import time

import pytest

import hatchery
from hatchery import (AuthError, BadRequest, Client, ConnectionFailed, HatcheryError, NotFound, RateLimited, Sandbox,
                      ServerError, ServiceUnavailable)

import support


def test_401_wrong_or_missing_key(url):
    with pytest.raises(AuthError) as e:
        Sandbox.list(client=Client(url, "wrong-key"))
    assert e.value.status == 401 and e.value.code == "unauthorized" and isinstance(e.value, HatcheryError)


def test_key_file_is_read_for_a_local_daemon(url, tmp_path, monkeypatch):
    monkeypatch.delenv("HATCHERY_API_KEY")
    keyfile = tmp_path / "api_key"
    keyfile.write_text(support.KEY + "\n")
    assert Sandbox.list(client=Client(url, key_file=str(keyfile))) == []
    monkeypatch.setenv("HATCHERY_KEY_FILE", str(keyfile))
    assert Sandbox.list(client=Client(url)) == []
    keyfile.write_text("stale\n")
    with pytest.raises(AuthError):
        Sandbox.list(client=Client(url))
    # Not for a remote daemon: the key file belongs to the local one.
    monkeypatch.setenv("HATCHERY_KEY_FILE", str(tmp_path / "missing"))
    assert Client(url).transport._key is None


def test_url_from_environment(url, monkeypatch):
    monkeypatch.setenv("HATCHERY_URL", url + "/")
    assert Client().url == url
    monkeypatch.delenv("HATCHERY_URL")
    assert Client().url == "http://127.0.0.1:7423"


def test_404_and_400(client):
    with pytest.raises(NotFound) as e:
        Sandbox.get("sbx_doesnotexist0000", client=client)
    assert e.value.code == "sandbox_not_found" and "sbx_doesnotexist0000" in e.value.message
    with pytest.raises(BadRequest) as e:
        Sandbox.create(ttl_seconds=0, client=client)
    assert e.value.status == 400 and e.value.code == "invalid_request"
    with pytest.raises(NotFound) as e:
        Sandbox.create(template="no-such-template", client=client)
    assert e.value.code == "template_not_found"


def test_503_capacity_is_retried_then_raised(daemon):
    """A daemon capped at one sandbox answers the second create with 503
    capacity and Retry-After: 1. The SDK waits and retries (a refused
    create did nothing) and raises ServiceUnavailable when retries run out."""
    d = support.start_daemon(["--max-sandboxes", "1"], bake=False)
    try:
        url = f"http://127.0.0.1:{d.port}"
        first = Sandbox.create(ttl_seconds=60, client=Client(url, support.KEY))
        d.created.add(first.id)
        t = time.time()
        with pytest.raises(ServiceUnavailable) as e:
            Sandbox.create(ttl_seconds=60, client=Client(url, support.KEY, max_retries=2))
        assert time.time() - t >= 2.0  # two waits of Retry-After
        assert e.value.status == 503 and e.value.code == "capacity" and e.value.retry_after == 1.0
        assert isinstance(e.value, ServerError)
        t = time.time()
        with pytest.raises(ServiceUnavailable):
            Sandbox.create(ttl_seconds=60, client=Client(url, support.KEY, max_retries=0))
        assert time.time() - t < 1.0
        first.kill()
        # Freed: the same call now succeeds.
        again = Sandbox.create(ttl_seconds=60, client=Client(url, support.KEY))
        d.created.add(again.id)
        again.kill()
    finally:
        support.stop_daemon(d)


def test_429_rate_limited(proxy):
    """A rate-limiting gateway in front of the daemon (the test proxy): the
    first n requests get 429 with Retry-After: 1. (The daemon's own 429,
    ``too_many``, is in test_processes.py.)"""
    c = Client(f"{proxy.url}/ratelimit/a/5", support.KEY, max_retries=0)
    with pytest.raises(RateLimited) as e:
        Sandbox.list(client=c)
    assert e.value.status == 429 and e.value.retry_after == 1.0 and e.value.code == "rate_limited"
    # With retries, it waits Retry-After and gets through once the limit lifts.
    t = time.time()
    c = Client(f"{proxy.url}/ratelimit/b/2", support.KEY, max_retries=2)
    with Sandbox.create(ttl_seconds=60, client=c) as s:  # a POST: a 429 did nothing, so it is retried too
        assert s.exec("echo via-proxy").stdout == "via-proxy\n"
    assert time.time() - t >= 2.0


def test_connection_refused():
    port = support.free_port()
    with pytest.raises(ConnectionFailed):
        Sandbox.list(client=Client(f"http://127.0.0.1:{port}", "k", max_retries=0))


def test_error_hierarchy():
    for cls in (hatchery.AuthError, hatchery.NotFound, hatchery.RateLimited, hatchery.Conflict,
                hatchery.SandboxTimeout, hatchery.ServerError, hatchery.TooLarge, hatchery.StreamError):
        assert issubclass(cls, HatcheryError)
    assert os.environ.get("HATCHERY_URL")


def test_410_sandbox_lost_is_a_typed_not_found():
    """The wire shape of a lost sandbox (only several hosts on a shared
    store answer it live: tests/store/test_hosts_api.py)."""
    from hatchery.errors import error_for, error_from_event
    e = error_for(410, "sandbox_lost", "lost", detail={"host": "h1", "lost_at_ms": 5, "reason": "r"})
    assert isinstance(e, hatchery.SandboxLost) and isinstance(e, hatchery.NotFound)
    assert (e.status, e.host, e.lost_at_ms, e.reason) == (410, "h1", 5, "r")
    e = error_from_event({"error": {"code": "sandbox_lost", "message": "m", "host": "h2"}})
    assert isinstance(e, hatchery.SandboxLost) and e.status == 410 and e.host == "h2"
    assert not isinstance(error_for(410, "gone", "m"), hatchery.SandboxLost)
