"""Hardening: special files in the files API, paths that are not UTF-8,
half-open and surplus HTTP connections, the disk quota. Every test is
bounded in time (socket timeouts) and in count."""

import time
import urllib.parse

from harness import Daemon, KEY  # noqa: F401


def files_url(sid, path_qs):
    return f"/v1/sandboxes/{sid}/files?path={path_qs}"


# 2. Special files ---------------------------------------------------------

def test_descriptor_links_are_refused_and_the_sandbox_survives(daemon, sandbox):
    t0 = time.time()
    for path in ["/proc/self/fd/0", "/proc/1/fd/0", "/proc/1/fd/1", "/dev/fd/0", "/dev/stdin",
                 "/proc/self/task/1/fd/0"]:
        r = daemon.request("GET", files_url(sandbox, urllib.parse.quote(path)), timeout=20)
        assert r.status == 400 and r.error_code() == "not_a_regular_file", (path, r)
        r = daemon.request("PUT", files_url(sandbox, urllib.parse.quote(path)), raw=b"junk", timeout=20)
        assert r.status == 400 and r.error_code() == "not_a_regular_file", (path, r)
    assert time.time() - t0 < 20
    # The channel is intact: exec and files still work.
    assert daemon.exec(sandbox, "echo alive", timeout_seconds=10)["stdout"] == "alive\n"
    assert daemon.put_file(sandbox, "/work/ok.txt", b"hello").status == 204
    assert daemon.get_file(sandbox, "/work/ok.txt").body == b"hello"


def test_fifos_sockets_devices_and_links_to_them_are_refused(daemon, sandbox):
    r = daemon.exec(sandbox, "mkfifo /tmp/fifo && ln -s /proc/1/fd/0 /tmp/chan && ln -s /dev/zero /tmp/z"
                    " && python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); s.bind('/tmp/sock')\""
                    " && echo ok", timeout_seconds=20)
    assert r["stdout"] == "ok\n", r
    t0 = time.time()
    for path in ["/tmp/fifo", "/tmp/chan", "/tmp/z", "/tmp/sock", "/dev/zero", "/dev/null", "/dev/urandom"]:
        r = daemon.get_file(sandbox, path)
        assert r.status == 400 and r.error_code() == "not_a_regular_file", (path, r)
        r = daemon.put_file(sandbox, path, b"x" * 1000)
        assert r.status == 400 and r.error_code() == "not_a_regular_file", (path, r)
    assert time.time() - t0 < 20, "refusals must not wait for anything"
    # Nothing was opened behind a reader's back: the FIFO is still a FIFO,
    # the sandbox still answers.
    r = daemon.exec(sandbox, "test -p /tmp/fifo && echo fifo", timeout_seconds=10)
    assert r["stdout"] == "fifo\n", r
    # A symlink to a regular file is still fine.
    daemon.exec(sandbox, "echo data > /tmp/real && ln -s /tmp/real /tmp/link", timeout_seconds=10)
    assert daemon.get_file(sandbox, "/tmp/link").body == b"data\n"


# 3. Paths that are not UTF-8 ----------------------------------------------

def test_non_utf8_paths_are_refused(daemon, sandbox):
    for method, url in [("PUT", files_url(sandbox, "/work/%ff%fe")),
                        ("GET", files_url(sandbox, "/work/%ff%fe")),
                        ("DELETE", files_url(sandbox, "/work/%ff%fe")),
                        ("GET", f"/v1/sandboxes/{sandbox}/files/list?path=/work/%C3")]:
        r = daemon.request(method, url, raw=b"x" if method == "PUT" else None)
        assert r.status == 400 and r.error_code() == "invalid_query", (method, url, r)
    r = daemon.exec(sandbox, "ls -A /work | wc -l", timeout_seconds=10)
    assert r["stdout"].strip() == "0", r
    # Valid UTF-8, percent-encoded, still works.
    assert daemon.request("PUT", files_url(sandbox, "/work/%E2%82%AC"), raw=b"euro").status == 204
    assert daemon.get_file(sandbox, "/work/\u20ac").body == b"euro"


