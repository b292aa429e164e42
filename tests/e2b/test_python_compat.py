"""E2B behaviours beyond the basics (issue 35), each with the official `e2b`
Python SDK against a live daemon: pause bodies and filesystem-only
pauses, list filters,
Template.exists, remove of a missing path, watch events as envd reports
them, gzip uploads and signed file URLs."""

import datetime
import gzip
import os
import time
import urllib.parse

import httpx
import pytest
from e2b import FilesystemEventType, Sandbox, SandboxException, SandboxQuery, Template

from harness import KEY

# The daemon's --max-file-bytes in these suites (tests/sdk/support.py).
from support import MAX_FILE_BYTES


def sandbox_url(daemon):
    return f"http://127.0.0.1:{daemon.port}/e2b/sandbox"


def pause_snapshots(daemon, e2b_id):
    """Hatchery snapshots that are pause records of `e2b_id`."""
    r = daemon.request("GET", f"/v1/snapshots?metadata.e2b_paused_sandbox={e2b_id}")
    assert r.status == 200, r
    return r.json()["snapshots"]


def test_filesystem_only_pause_keeps_files_and_drops_processes(daemon):
    s = Sandbox.create("base", timeout=300)
    try:
        s.files.write("/home/user/kept.txt", "kept")
        s.commands.run("mkdir -p /home/user/deep/er && echo x > /home/user/deep/er/f && "
                       "ln -s deep/er/f /home/user/link && chmod 640 /home/user/kept.txt")
        s.commands.run("python3 -c 'import time; time.sleep(3600)'", background=True)
        # keep_memory=False is what SDK 2.63 sends as {"memory": false}.
        assert s.pause(keep_memory=False) is True
        assert s.get_info().state.value == "paused"
        [snap] = pause_snapshots(daemon, s.sandbox_id)
        assert snap["memory"] is False
        assert Sandbox.pause(s.sandbox_id, mode="filesystem") is False  # already paused: 409
        back = Sandbox.connect(s.sandbox_id, timeout=120)
        assert back.sandbox_id == s.sandbox_id
        assert back.get_info().state.value == "running"
        assert back.files.read("/home/user/kept.txt") == "kept"
        assert back.files.read("/home/user/link") == "x\n"
        # Owner and mode as they were (the SDK's user wrote the file).
        st = back.commands.run("stat -c '%U %a' /home/user/kept.txt").stdout.split()
        assert st == ["user", "640"], st
        # Memory is gone: the process did not come back; the sandbox works.
        assert not any("time.sleep(3600)" in " ".join([p.cmd, *p.args]) for p in back.commands.list())
        assert back.commands.run("echo ok").stdout == "ok\n"
        # Paused again the newer way, then resumed with on_resume="reboot"
        # ({"memory": false} on connect: what such a resume is anyway).
        back.files.write("/home/user/kept.txt", "twice")
        assert back.pause(mode="filesystem") is True
        again = Sandbox.connect(s.sandbox_id, timeout=120, on_resume="reboot")
        assert again.files.read("/home/user/kept.txt") == "twice"
        assert again.files.read("/home/user/deep/er/f") == "x\n"
        # A memory pause cannot be rebooted from files: 400, still paused.
        assert again.pause() is True
        with pytest.raises(SandboxException, match="filesystem-only pause"):
            Sandbox.connect(s.sandbox_id, on_resume="reboot")
        assert Sandbox.get_info(s.sandbox_id).state.value == "paused"
        assert Sandbox.connect(s.sandbox_id).files.read("/home/user/kept.txt") == "twice"
        paused_ids = [x["id"] for x in pause_snapshots(daemon, s.sandbox_id)]
        assert s.pause(keep_memory=False) is True
        paused_ids += [x["id"] for x in pause_snapshots(daemon, s.sandbox_id)]
    finally:
        Sandbox.kill(s.sandbox_id)
    # Killing a paused sandbox removes its pause: no row, no image.
    assert pause_snapshots(daemon, s.sandbox_id) == []
    left = os.listdir(os.path.join(daemon.data_dir, "snapshots"))
    assert not set(paused_ids) & set(left), (paused_ids, left)


def test_pause_bodies_that_are_refused(daemon):
    s = Sandbox.create("base", timeout=300)
    try:
        url = f"http://127.0.0.1:{daemon.port}/e2b/sandboxes/{s.sandbox_id}/pause"
        for bad in ({"memory": "no"}, {"memory": 0}, {"mode": "disk"}, {"memory": True, "mode": "filesystem"}):
            r = httpx.post(url, json=bad, headers={"X-API-KEY": KEY})
            assert r.status_code == 400 and r.json()["code"] == 400, (bad, r.text)
        assert s.get_info().state.value == "running"
        # What 2.45 sends for a plain pause ({"memory": true}).
        assert s.pause(keep_memory=True) is True
        assert s.get_info().state.value == "paused"
        assert Sandbox.pause(s.sandbox_id, mode="full") is False  # already paused: 409
    finally:
        Sandbox.kill(s.sandbox_id)


def test_list_filters_started_after_and_template(daemon):
    tag = f"f{time.time_ns()}"
    a = Sandbox.create("base", metadata={"suite": tag})
    try:
        time.sleep(1.1)
        cut = datetime.datetime.now(datetime.timezone.utc)
        b = Sandbox.create("code-interpreter-v1", metadata={"suite": tag})
        try:
            def ids(**q):
                items = Sandbox.list(query=SandboxQuery(metadata={"suite": tag}, **q)).next_items()
                return sorted(x.sandbox_id for x in items)

            assert ids() == sorted([a.sandbox_id, b.sandbox_id])
            assert ids(started_after=cut) == [b.sandbox_id]
            # "At or after": a's own start time includes it.
            assert ids(started_after=a.get_info().started_at) == sorted([a.sandbox_id, b.sandbox_id])
            assert ids(started_after=cut + datetime.timedelta(hours=1)) == []
            assert ids(template="base") == [a.sandbox_id]
            # An E2B name and the Hatchery template it stands for.
            assert ids(template="code-interpreter-v1") == [b.sandbox_id]
            assert ids(template="code-interpreter") == [b.sandbox_id]
            assert ids(template="base", started_after=cut) == []
            assert ids(template="no-such-template") == []
        finally:
            b.kill()
    finally:
        a.kill()
    base = f"http://127.0.0.1:{daemon.port}/e2b/v2/sandboxes"
    for bad in ("startedAfter=yesterday", "startedAfter=2026-13-01T00:00:00Z", "template="):
        r = httpx.get(f"{base}?{bad}", headers={"X-API-KEY": KEY})
        assert r.status_code == 400 and r.json()["code"] == 400, (bad, r.text)


def test_template_exists(daemon):
    assert Template.exists("base") is True
    assert Template.exists("code-interpreter-v1") is True
    assert Template.exists("no-such-template") is False
    r = httpx.get(f"http://127.0.0.1:{daemon.port}/e2b/templates/aliases/base",
                  headers={"X-API-KEY": KEY})
    assert r.status_code == 200 and r.json() == {"templateID": "base", "public": False}
    r = httpx.get(f"http://127.0.0.1:{daemon.port}/e2b/templates/aliases/nope",
                  headers={"X-API-KEY": KEY})
    assert r.status_code == 404 and r.json()["code"] == 404
    r = httpx.get(f"http://127.0.0.1:{daemon.port}/e2b/templates/aliases/base")
    assert r.status_code == 401


def test_remove_of_a_missing_path_succeeds(sbx):
    sbx.files.remove("never-existed.txt")
    sbx.files.remove("/home/user/no/such/dir")
    sbx.files.write("gone.txt", "x")
    sbx.files.remove("gone.txt")
    sbx.files.remove("gone.txt")
    assert not sbx.files.exists("gone.txt")


def test_watch_reports_what_envd_reports_for_one_write(sbx):
    # As E2B's own test_watch_iterated: a new file written into a watched
    # directory is create, chmod (envd's upload chowns it) and write.
    sbx.files.make_dir("wi")
    w = sbx.files.watch_dir("wi")
    sbx.files.write("wi/f.txt", "first")
    events = w.get_new_events()
    deadline = time.time() + 3
    while time.time() < deadline:
        time.sleep(0.3)
        events += w.get_new_events()
    assert [(e.name, e.type) for e in events] == [
        ("f.txt", FilesystemEventType.CREATE),
        ("f.txt", FilesystemEventType.CHMOD),
        ("f.txt", FilesystemEventType.WRITE),
    ]
    # Writing it again: a write is reported again (not merged away).
    sbx.files.write("wi/f.txt", "second")
    events = []
    deadline = time.time() + 10
    while time.time() < deadline and FilesystemEventType.WRITE not in [e.type for e in events]:
        events += w.get_new_events()
        time.sleep(0.2)
    assert ("f.txt", FilesystemEventType.WRITE) in [(e.name, e.type) for e in events]
    w.stop()


def test_gzip_upload_and_bomb(sbx, daemon):
    data = bytes(range(256)) * 64
    sbx.files.write("z/plain.bin", data, gzip=True)
    assert bytes(sbx.files.read("z/plain.bin", format="bytes")) == data
    assert sbx.files.get_info("z/plain.bin").owner == "user"
    headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "X-Access-Token": sbx._envd_access_token,
               "Content-Type": "application/octet-stream", "Content-Encoding": "gzip"}
    url = f"{sandbox_url(daemon)}/files"
    # Exactly the cap expands fine; one byte more is cut off with 413.
    at_cap = gzip.compress(b"\0" * MAX_FILE_BYTES)
    r = httpx.post(url, params={"path": "/home/user/z/cap.bin"}, headers=headers, content=at_cap)
    assert r.status_code == 200, r.text
    assert sbx.files.get_info("z/cap.bin").size == MAX_FILE_BYTES
    # A bomb: 64 times the cap, compressed to far less than the cap.
    bomb = gzip.compress(b"\0" * (64 * MAX_FILE_BYTES))
    assert len(bomb) < MAX_FILE_BYTES
    for body in (gzip.compress(b"\0" * (MAX_FILE_BYTES + 1)), bomb):
        r = httpx.post(url, params={"path": "/home/user/z/bomb.bin"}, headers=headers, content=body)
        assert r.status_code == 413 and "decompressed" in r.json()["message"], r.text
    r = httpx.post(url, params={"path": "/home/user/z/bad.bin"}, headers=headers, content=b"not gzip")
    assert r.status_code == 400 and "gzip" in r.json()["message"], r.text
    r = httpx.post(url, params={"path": "/home/user/z/br.bin"},
                   headers={**headers, "Content-Encoding": "br"}, content=b"x")
    assert r.status_code == 415, r.text
    # Nothing half-created by the refused uploads.
    assert not sbx.files.exists("z/bomb.bin") and not sbx.files.exists("z/bad.bin")
    assert not sbx.files.exists("z/br.bin")


def test_signed_urls(daemon):
    a = Sandbox.create("base", timeout=300)
    b = Sandbox.create("base", timeout=300)
    try:
        a.files.write("s/doc.txt", "from a")
        b.files.write("s/doc.txt", "from b")
        # The SDK's own URLs, built from E2B_SANDBOX_URL as docs/e2b.md sets it.
        url = a.download_url("s/doc.txt")
        assert urllib.parse.urlsplit(url).path == "/files", url
        r = httpx.get(url)
        assert r.status_code == 200 and r.text == "from a", r.text
        r = httpx.get(b.download_url("s/doc.txt", use_signature_expiration=60))
        assert r.status_code == 200 and r.text == "from b"
        up = a.upload_url("s/up.txt")
        r = httpx.post(up, files={"file": ("up.txt", b"uploaded")})
        assert r.status_code == 200, r.text
        assert a.files.read("s/up.txt") == "uploaded"
        assert a.files.get_info("s/up.txt").owner == "user"
        a.files.write("/root/r.txt", "root's", user="root")
        r = httpx.get(a.download_url("/root/r.txt", user="root"))
        assert r.status_code == 200 and r.text == "root's"

        def swap(u, **changes):
            p = urllib.parse.urlsplit(u)
            q = dict(urllib.parse.parse_qsl(p.query))
            q.update(changes)
            q = {k: v for k, v in q.items() if v is not None}
            return urllib.parse.urlunsplit(p._replace(query=urllib.parse.urlencode(q)))

        refused = [
            swap(url, signature="v1_" + "A" * 43),            # forged
            swap(url, path="s/up.txt"),                       # another path
            swap(url, username="root"),                       # another user
            swap(url, signature=None),                        # unsigned
            up,                                               # a write URL used to read
        ]
        for u in refused:
            r = httpx.get(u)
            assert r.status_code == 401 and r.json()["code"] == 401, (u, r.text)
        # A read URL used to upload.
        r = httpx.post(url, files={"file": ("doc.txt", b"overwritten")})
        assert r.status_code == 401
        assert a.files.read("s/doc.txt") == "from a"
        # Expired.
        short = a.download_url("s/doc.txt", use_signature_expiration=1)
        time.sleep(2.2)
        r = httpx.get(short)
        assert r.status_code == 401 and r.json() == {"code": 401, "message": "signature is already expired"}
        r = httpx.get(swap(short, signature_expiration=str(int(time.time()) + 600)))
        assert r.status_code == 401 and "invalid" in r.json()["message"]
        # A killed sandbox's URLs stop working.
        b_url = b.download_url("s/doc.txt")
        b.kill()
        assert httpx.get(b_url).status_code == 401
    finally:
        a.kill()
        b.kill()


def test_metrics_from_the_sandboxs_cgroups(sbx):
    from e2b import SandboxNotFoundException

    [idle] = sbx.get_metrics()
    assert idle.cpu_count == 1 and idle.mem_total == 512 << 20 and idle.disk_total == 256 << 20
    assert 0 < idle.mem_used < idle.mem_total and 0 < idle.disk_used < idle.disk_total
    assert abs(idle.timestamp.timestamp() - time.time()) < 30
    # The disk: 20 MiB more written.
    sbx.commands.run("head -c 20971520 /dev/urandom > /home/user/blob")
    [m] = sbx.get_metrics()
    assert m.disk_used - idle.disk_used >= 19 << 20, (idle, m)
    # Memory: 100 MiB touched by a process that keeps it.
    sbx.commands.run("python3 -c \"b = b'x' * (100 << 20); import time; time.sleep(60)\"",
                     background=True)
    deadline = time.time() + 20
    while time.time() < deadline:
        [m] = sbx.get_metrics()
        if m.mem_used - idle.mem_used >= 90 << 20:
            break
        time.sleep(0.5)
    assert m.mem_used - idle.mem_used >= 90 << 20, (idle, m)
    # CPU: a busy loop shows, an idle sandbox does not.
    [quiet] = sbx.get_metrics()
    sbx.commands.run("timeout 20 sh -c 'while :; do :; done'", background=True)
    time.sleep(1)
    [busy] = sbx.get_metrics()
    assert busy.cpu_used_pct >= 30 and busy.cpu_used_pct > quiet.cpu_used_pct + 20, (quiet, busy)
    # As E2B's own test: a window from before the create up to now (whole
    # seconds) has the sample; one that ends before now has none.
    start = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=5)
    assert len(sbx.get_metrics(start=start, end=datetime.datetime.now(datetime.timezone.utc))) == 1
    past = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=1)
    assert sbx.get_metrics(end=past) == []
    assert len(sbx.get_metrics(start=past)) == 1
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_metrics("nosuchsandbox123")
