"""Every bad input gets a clear 4xx and leaves nothing half-created."""

import os
import urllib.parse

import pytest

from harness import wait_baked

# One daemon for the module's tests (tests/integration/conftest.py).
SHARED_DAEMON = True


def count(daemon):
    return len(daemon.request("GET", "/v1/sandboxes").json()["sandboxes"])


def test_create_rejections_leave_nothing(daemon):
    wait_baked(daemon)  # so that no template builder is in the sandboxes dir
    cases = [
        ({"template": "no-such-template"}, 404, "template_not_found"),
        ({"template": "../../etc"}, 400, "invalid_template_name"),
        ({"ttl_seconds": 0}, 400, "invalid_request"),
        ({"ttl_seconds": -1}, 400, "invalid_request"),
        ({"ttl_seconds": 3601}, 400, "invalid_request"),  # over this daemon's --max-ttl
        ({"metadata": {"k": "v" * 513}}, 400, "invalid_request"),
        ({"metadata": {f"k{i}": "v" for i in range(33)}}, 400, "invalid_request"),
        ({"env": {"BAD-NAME": "x"}}, 400, "invalid_request"),
        ({"ttl": 5}, 400, "invalid_json"),  # unknown field
        ({"ttl_seconds": "soon"}, 400, "invalid_json"),
    ]
    for body, status, code in cases:
        r = daemon.request("POST", "/v1/sandboxes", body)
        assert (r.status, r.error_code()) == (status, code), (body, r)
    r = daemon.request("POST", "/v1/sandboxes", raw=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status == 400 and r.error_code() == "invalid_json"
    r = daemon.request("POST", "/v1/sandboxes", raw=b"{}", headers={"Content-Type": "text/plain"})
    assert r.status == 415
    r = daemon.request("POST", "/v1/sandboxes", raw=b"[" * (3 << 20), headers={"Content-Type": "application/json"})
    assert r.status == 413
    # Boundary: exactly the cap is fine.
    ok = daemon.request("POST", "/v1/sandboxes", {"ttl_seconds": 3600, "metadata": {"k" * 64: "v" * 512}})
    assert ok.status == 201, ok
    daemon.created.add(ok.json()["id"])
    assert count(daemon) == 1
    assert os.listdir(os.path.join(daemon.data_dir, "sandboxes")) == [ok.json()["id"]]


def test_path_rules(daemon, sandbox):
    for path, status in [("relative.txt", 400), ("/work/../../etc/passwd", 400), ("/a/./b", 400),
                         ("/a//b", 400), ("", 400), ("/" + "a" * 5000, 400)]:
        r = daemon.get_file(sandbox, path)
        assert r.status == status, (path, r)
        r = daemon.put_file(sandbox, path, b"x")
        assert r.status == status, (path, r)
    r = daemon.request("GET", f"/v1/sandboxes/{sandbox}/files")
    assert r.status == 400 and r.error_code() == "invalid_query"
    r = daemon.request("DELETE", f"/v1/sandboxes/{sandbox}/files?path=/")
    assert r.status == 400


def test_symlink_never_reaches_host_files(daemon, sandbox):
    secret = f"/tmp/hatchery-host-secret-{os.getpid()}"
    with open(secret, "w") as f:
        f.write("HOST SECRET")
    try:
        daemon.exec(sandbox, f"mkdir -p /work && ln -s {secret} /work/link && ln -s /etc/hostname /work/h")
        r = daemon.get_file(sandbox, "/work/link")
        assert r.status == 404 and b"HOST SECRET" not in r.body
        # A link resolves inside the sandbox: to its own /etc/hostname.
        daemon.exec(sandbox, "echo in-sandbox > /etc/hostname")
        assert daemon.get_file(sandbox, "/work/h").body == b"in-sandbox\n"
        # Writing through a link writes the sandbox's file, not the host's.
        daemon.exec(sandbox, f"ln -s {secret} /work/w")
        daemon.put_file(sandbox, "/work/w", b"overwritten")
        assert open(secret).read() == "HOST SECRET"
    finally:
        os.unlink(secret)


def test_upload_cap_boundary(daemon, sandbox):
    cap = 4 << 20  # the fixture's --max-file-bytes
    assert daemon.put_file(sandbox, "/work/at-cap", b"a" * cap).status == 204
    r = daemon.put_file(sandbox, "/work/over-cap", b"a" * (cap + 1))
    assert r.status == 413 and r.error_code() == "too_large"
    assert daemon.get_file(sandbox, "/work/over-cap").status == 404
    # Devices are not files: refused before anything is read (they would
    # not say their size).
    r = daemon.get_file(sandbox, "/dev/zero")
    assert r.status == 400 and r.error_code() == "not_a_regular_file", r


def test_exec_rejections(daemon, sandbox):
    url = f"/v1/sandboxes/{sandbox}/exec"
    for body in [{"cmd": ""}, {"cmd": "   "}, {}, {"argv": []}, {"cmd": "a", "argv": ["b"]},
                 {"cmd": "true", "timeout_seconds": 0}, {"cmd": "true", "timeout_seconds": 3601},
                 {"cmd": "true", "max_output_bytes": 0}, {"cmd": "true", "max_output_bytes": (16 << 20) + 1},
                 {"cmd": "true", "cwd": "tmp"}, {"cmd": "true", "stdin": "x" * ((1 << 20) + 1)}]:
        r = daemon.request("POST", url, body)
        assert r.status == 400, (body, r)
    r = daemon.request("POST", url, {"cmd": "true", "cwd": "/no/such/dir"})
    assert r.status == 404
    r = daemon.request("POST", "/v1/sandboxes/sbx_doesnotexist0000/exec", {"cmd": "true"})
    assert r.status == 404 and r.error_code() == "sandbox_not_found"
    daemon.delete(sandbox)
    r = daemon.request("POST", url, {"cmd": "true"})
    assert r.status in (404, 409), r
    r = daemon.request("PATCH", f"/v1/sandboxes/{sandbox}", {"ttl_seconds": 10})
    assert r.status == 404


def test_capacity_is_a_503_not_a_crash(daemon):
    from harness import Daemon
    small = Daemon(extra_args=["--max-sandboxes", "1"]).start()
    try:
        small.create()
        r = small.request("POST", "/v1/sandboxes", {})
        assert r.status == 503 and r.error_code() == "capacity" and "retry-after" in {k.lower() for k in r.headers}
    finally:
        small.cleanup()
