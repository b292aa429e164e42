import time

import pytest

import hatchery
from hatchery import ExecResult, NotFound, Sandbox, SandboxInfo


def test_create_get_list_set_ttl_kill(daemon, client):
    s = Sandbox.create(template="code-interpreter", ttl_seconds=120, metadata={"owner": "alice", "k": "v"},
                       env={"MODE": "test"}, client=client)
    daemon.created.add(s.id)
    assert s.id.startswith("sbx_") and s.state == "running" and s.template == "code-interpreter"
    assert isinstance(s.info, SandboxInfo) and s.boot_mode in ("pool", "restore", "cold") and s.boot_ms >= 0
    assert s.metadata == {"owner": "alice", "k": "v"}

    other = Sandbox.create(ttl_seconds=60, metadata={"owner": "bob"}, client=client)
    daemon.created.add(other.id)
    got = Sandbox.get(s.id, client=client)
    assert got.id == s.id and got.expires_at == s.expires_at and got.boot_mode is None
    assert [x.id for x in Sandbox.list(client=client)] == [s.id, other.id]
    assert [x.id for x in Sandbox.list(metadata={"owner": "alice"}, client=client)] == [s.id]
    assert [x.id for x in Sandbox.list(metadata={"owner": "alice", "k": "nope"}, client=client)] == []

    assert s.exec("echo $MODE").stdout == "test\n"
    before = s.expires_at
    time.sleep(1.1)
    assert s.set_ttl(1800) is s and s.expires_at > before
    assert Sandbox.get(s.id, client=client).expires_at == s.expires_at

    s.kill()
    s.kill()  # idempotent
    assert not s.is_running()
    with pytest.raises(NotFound) as e:
        Sandbox.get(s.id, client=client)
    assert e.value.status == 404 and e.value.code == "sandbox_not_found"
    other.kill()
    assert Sandbox.list(client=client) == []


def test_default_client_from_environment(daemon):
    # conftest set HATCHERY_URL / HATCHERY_API_KEY; no client argument.
    s = Sandbox.create(ttl_seconds=60)
    daemon.created.add(s.id)
    assert Sandbox.get(s.id).id == s.id
    s.kill()


def test_context_manager_kills_on_exit_and_on_exception(daemon, client):
    with Sandbox.create(ttl_seconds=120, client=client) as s:
        daemon.created.add(s.id)
        assert s.exec("true").exit_code == 0
    with pytest.raises(NotFound):
        Sandbox.get(s.id, client=client)

    with pytest.raises(ZeroDivisionError):
        with Sandbox.create(ttl_seconds=120, client=client) as s2:
            daemon.created.add(s2.id)
            s2.filesystem.write("/workspace/x", "1")
            1 / 0
    with pytest.raises(NotFound):
        Sandbox.get(s2.id, client=client)
    assert Sandbox.list(client=client) == []


def test_exec_result_fields(sbx):
    r = sbx.exec("echo out; echo err >&2; exit 3", timeout_seconds=10)
    assert isinstance(r, ExecResult)
    assert (r.stdout, r.stderr, r.exit_code, r.timed_out, r.truncated, r.oom_killed) == ("out\n", "err\n", 3, False,
                                                                                          False, False)
    assert r.duration_ms >= 0 and r.cpu_ms >= 0 and not r.ok
    assert r.reason == "exited" and r.contained is True
    assert r.memory_peak_bytes is None or r.memory_peak_bytes > 0


def test_exec_options(sbx):
    sbx.filesystem.write("/workspace/d/f.txt", "x")
    assert sbx.exec("pwd; ls", cwd="/workspace/d").stdout == "/workspace/d\nf.txt\n"
    assert sbx.exec("echo $A-$B", env={"A": "1", "B": "2"}).stdout == "1-2\n"
    assert sbx.exec("tr a-z A-Z", stdin="hello").stdout == "HELLO"
    assert sbx.exec("cat", stdin=b"bytes").stdout == "bytes"
    assert sbx.exec(argv=["python3", "-c", "import sys; print(sys.argv[1])", "a b; c"]).stdout == "a b; c\n"
    r = sbx.exec("head -c 5000 /dev/zero | tr '\\0' a", max_output_bytes=100)
    assert r.truncated and len(r.stdout) == 100 and r.reason == "output_limit"
    with pytest.raises(ValueError):
        sbx.exec("true", argv=["true"])
    with pytest.raises(NotFound) as e:
        sbx.exec("true", cwd="/nope")
    assert e.value.code == "not_found"


def test_exec_timeout_is_a_result(sbx):
    t = time.time()
    r = sbx.exec("sleep 30", timeout_seconds=1)
    assert r.timed_out and r.exit_code == 137 and r.reason == "timeout" and time.time() - t < 10


def test_refresh_and_attributes(sbx, client):
    assert sbx.refresh() is sbx and sbx.is_running()
    with pytest.raises(AttributeError):
        sbx.no_such_field
    assert repr(sbx).startswith("<Sandbox sbx_")


def test_health_metrics_openapi(client):
    h = client.health()
    assert h["status"] == "ok" and h["runtime"] == "gvisor"
    assert "hatchery_" in client.metrics()
    assert "/v1/sandboxes" in client.openapi()["paths"]


def test_connection_reuse(client, sbx):
    """Sequential calls go over one kept-alive connection."""
    for _ in range(5):
        sbx.refresh()
    assert len(client.transport._idle) == 1
    conn = client.transport._idle[0][0]
    sbx.exec("true")
    assert [c for c, _ in client.transport._idle] == [conn]


def test_module_exports():
    for name in hatchery.__all__:
        assert hasattr(hatchery, name), name


def test_installed_package_is_under_test():
    """Under `make sdk-python-test` the suite must exercise the
    pip-installed package, not the source tree."""
    import os
    if os.environ.get("HATCHERY_SDK_INSTALLED"):
        assert "site-packages" in hatchery.__file__, hatchery.__file__
