"""Template checkpoints, the warm pool, snapshots and forks, against real
runsc checkpoint/restore."""

import glob
import hashlib
import json
import os
import time

import pytest

from harness import Daemon, metric, wait_baked, wait_for

# One daemon for the module's tests (tests/integration/conftest.py).
SHARED_DAEMON = True


def create(d, **kw):
    r = d.request("POST", "/v1/sandboxes", kw)
    assert r.status == 201, r
    d.created.add(r.json()["id"])
    return r.json()


@pytest.fixture
def pooled():
    d = Daemon(extra_args=["--pool-size", "2"]).start()
    yield d
    d.cleanup()


def test_pool_hands_out_fresh_sandboxes_and_refills(pooled):
    d = pooled
    wait_for(lambda: metric(d, "hatchery_pool_ready") >= 2, what="pool to fill")
    first = create(d, ttl_seconds=60)
    assert first["boot_mode"] == "pool", first
    assert first["boot_ms"] < 100
    # Its TTL starts at claim, not when it was pooled.
    assert first["expires_at"] > first["created_at"]
    d.exec(first["id"], "echo used > /tmp/mark; touch /workspace-mark")
    seen = []
    for _ in range(4):
        s = create(d)
        r = d.exec(s["id"], "cat /tmp/mark 2>/dev/null; ls /workspace-mark 2>/dev/null; echo end")
        seen.append((s["boot_mode"], r["stdout"]))
    assert all(out == "end\n" for _, out in seen), seen
    # Claimed sandboxes never come back; the pool refills on its own.
    wait_for(lambda: metric(d, "hatchery_pool_ready") >= 2, what="pool to refill")
    ids = {s["id"] for s in d.request("GET", "/v1/sandboxes").json()["sandboxes"]}
    assert len(ids) == 5, "pooled sandboxes are not listed"


@pytest.mark.fresh_daemon  # corrupts the daemon's template image
def test_restore_then_cold_when_the_checkpoint_is_corrupt(daemon):
    wait_baked(daemon)
    baked = metric(daemon, "hatchery_template_images_baked_total")
    s = create(daemon)
    assert s["boot_mode"] == "restore", s
    assert daemon.exec(s["id"], "python3 -c 'print(6*7)'")["stdout"] == "42\n"
    img = glob.glob(os.path.join(daemon.data_dir, "images", "*", "checkpoint.img"))[0]
    with open(img, "r+b") as f:
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 0xFF]))
    s = create(daemon)
    assert s["boot_mode"] == "cold", "a checkpoint that fails its checksum is never restored"
    assert daemon.exec(s["id"], "echo ok")["stdout"] == "ok\n"
    # ...and a fresh one is baked for the next create.
    wait_for(lambda: metric(daemon, "hatchery_template_images_baked_total") >= baked + 1, what="re-bake")
    assert create(daemon)["boot_mode"] == "restore"


@pytest.mark.fresh_daemon  # damages the daemon's template image
def test_a_checkpoint_the_runtime_refuses_is_booted_cold_and_rebaked(daemon):
    # An image whose manifest matches (so it passes its checksum) but that
    # runsc cannot restore: the create is not failed, it boots cold; the
    # image is dropped and baked again, and the next create restores.
    wait_baked(daemon)
    baked = metric(daemon, "hatchery_template_images_baked_total")
    img = glob.glob(os.path.join(daemon.data_dir, "images", "*", "checkpoint.img"))[0]
    with open(img, "r+b") as f:
        f.truncate(os.path.getsize(img) // 2)
    data = open(img, "rb").read()
    manifest = os.path.join(os.path.dirname(img), "manifest.json")
    m = json.load(open(manifest))
    m["files"]["checkpoint.img"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    with open(manifest, "w") as f:
        json.dump(m, f)
    s = create(daemon)
    assert s["boot_mode"] == "cold", s
    assert daemon.exec(s["id"], "python3 -c 'print(6*7)'")["stdout"] == "42\n"
    assert metric(daemon, "hatchery_restore_fallbacks_total") == 1
    # The refused attempt left nothing: only the cold one is listed.
    listed = [x["id"] for x in daemon.request("GET", "/v1/sandboxes").json()["sandboxes"]]
    assert listed == [s["id"]], listed
    wait_for(lambda: metric(daemon, "hatchery_template_images_baked_total") >= baked + 1, what="re-bake")
    assert create(daemon)["boot_mode"] == "restore"


def test_snapshot_fork_sees_snapshot_state_and_forks_are_isolated(daemon):
    src = create(daemon, env={"FROM_CREATE": "yes"})["id"]
    daemon.put_file(src, "/workspace/solution.py", b"print('v1')")
    daemon.exec(src, "echo scratch > /tmp/deleted-later; exec 3</tmp/deleted-later; sleep 0")
    r = daemon.request("POST", f"/v1/sandboxes/{src}/snapshots", {"retention_seconds": 600, "metadata": {"who": "c-42"}})
    assert r.status == 201, r
    snap = r.json()
    assert snap["id"].startswith("snap_") and snap["sandbox_id"] == src and snap["size_bytes"] > 0
    # The original keeps running and changes after the snapshot.
    daemon.put_file(src, "/workspace/solution.py", b"print('v2')")
    assert daemon.exec(src, "python3 /workspace/solution.py")["stdout"] == "v2\n"

    r = daemon.request("POST", f"/v1/snapshots/{snap['id']}/fork", {"count": 3, "metadata": {"role": "reviewer"}})
    assert r.status == 201, r
    forks = [s["id"] for s in r.json()["sandboxes"]]
    daemon.created.update(forks)
    assert len(set(forks)) == 3 and all(s["boot_mode"] == "fork" for s in r.json()["sandboxes"])
    for i, f in enumerate(forks):
        out = daemon.exec(f, "python3 /workspace/solution.py; cat /tmp/deleted-later; echo $FROM_CREATE")["stdout"]
        assert out == "v1\nscratch\nyes\n", out
        daemon.exec(f, f"echo fork{i} > /workspace/mine")
    for i, f in enumerate(forks):
        assert daemon.exec(f, "cat /workspace/mine")["stdout"] == f"fork{i}\n"
    assert daemon.exec(src, "cat /workspace/mine 2>&1 || true")["stdout"].startswith("cat:")

    listed = daemon.request("GET", "/v1/snapshots?metadata.who=c-42").json()["snapshots"]
    assert [s["id"] for s in listed] == [snap["id"]]
    assert daemon.request("GET", "/v1/snapshots?metadata.who=nobody").json()["snapshots"] == []
    assert daemon.request("GET", f"/v1/snapshots/{snap['id']}").json()["size_bytes"] == snap["size_bytes"]


def test_a_files_only_snapshot_keeps_files_and_drops_processes(daemon):
    # A filesystem-only pause through the v1 API: a snapshot with
    # memory false, the sandbox deleted, and forks of the snapshot.
    src = create(daemon, env={"FROM_CREATE": "yes"})["id"]
    daemon.put_file(src, "/workspace/solution.py", b"print('v1')")
    daemon.exec(src, "mkdir -p /root/a/b && echo deep > /root/a/b/c && chmod 604 /root/a/b/c && "
                     "ln -s a/b/c /root/l && echo t > /tmp/t && chown 1234:1234 /tmp/t")
    # Template files deleted in the sandbox stay deleted: a file, and a
    # directory with what is under it.
    out = daemon.exec(src, "test -f /etc/motd && test -d /usr/share/lintian && "
                           "rm /etc/motd && rm -r /usr/share/lintian && echo removed")
    assert out["stdout"] == "removed\n", out
    r = daemon.request("POST", f"/v1/sandboxes/{src}/exec", {"cmd": "sleep 3600", "background": True})
    assert r.status == 202, r
    assert daemon.exec(src, "ps -eo args | grep -c '^[s]leep 3600$'")["stdout"] == "1\n"
    r = daemon.request("POST", f"/v1/sandboxes/{src}/snapshots", {"memory": False, "metadata": {"k": "fs"}})
    assert r.status == 201, r
    snap = r.json()
    assert snap["memory"] is False and snap["sandbox_id"] == src and snap["size_bytes"] > 0
    d = os.path.join(daemon.data_dir, "snapshots", snap["id"])
    assert "checkpoint.img" not in os.listdir(d), os.listdir(d)
    assert daemon.request("GET", f"/v1/snapshots/{snap['id']}").json()["memory"] is False
    assert daemon.request("DELETE", f"/v1/sandboxes/{src}").status == 204

    r = daemon.request("POST", f"/v1/snapshots/{snap['id']}/fork", {"count": 2})
    assert r.status == 201, r
    forks = [s["id"] for s in r.json()["sandboxes"]]
    daemon.created.update(forks)
    assert all(s["boot_mode"] == "files" for s in r.json()["sandboxes"]), r.json()
    for i, f in enumerate(forks):
        out = daemon.exec(f, "python3 /workspace/solution.py; cat /root/a/b/c /root/l /tmp/t; "
                             "stat -c '%a' /root/a/b/c; stat -c '%u:%g' /tmp/t; echo $FROM_CREATE; "
                             "ps -eo args | grep -c '^[s]leep 3600$'; "
                             "ls /etc/motd /usr/share/lintian 2>&1 | grep -c 'No such file'; "
                             "test -f /etc/passwd && echo kept")
        # Files with their modes and owners; the env; no process of the
        # source; the template's deleted files gone, the others there.
        assert out["stdout"] == "v1\ndeep\ndeep\nt\n604\n1234:1234\nyes\n0\n2\nkept\n", out
        assert daemon.request("GET", f"/v1/sandboxes/{f}/processes").json()["processes"] == []
        daemon.exec(f, f"echo fork{i} > /workspace/mine")
    for i, f in enumerate(forks):
        assert daemon.exec(f, "cat /workspace/mine")["stdout"] == f"fork{i}\n"
    assert daemon.request("DELETE", f"/v1/snapshots/{snap['id']}").status == 204
    assert not os.path.exists(d)


def test_snapshot_files_are_private_and_delete_frees_them(daemon, sandbox):
    snap = daemon.request("POST", f"/v1/sandboxes/{sandbox}/snapshots", {}).json()
    d = os.path.join(daemon.data_dir, "snapshots", snap["id"])
    assert os.stat(d).st_mode & 0o777 == 0o700
    for f in os.listdir(d):
        assert os.stat(os.path.join(d, f)).st_mode & 0o777 == 0o600
    assert daemon.request("DELETE", f"/v1/snapshots/{snap['id']}").status == 204
    assert not os.path.exists(d)
    assert daemon.request("DELETE", f"/v1/snapshots/{snap['id']}").status == 204
    assert daemon.request("GET", f"/v1/snapshots/{snap['id']}").status == 404


def test_retention_expiry_deletes_files(daemon, sandbox):
    snap = daemon.request("POST", f"/v1/sandboxes/{sandbox}/snapshots", {"retention_seconds": 1}).json()
    d = os.path.join(daemon.data_dir, "snapshots", snap["id"])
    assert os.path.isdir(d)
    # The reaper removes a local snapshot's files, then its row (a crash
    # between the two leaves files the next sweep removes): wait for both.
    wait_for(lambda: not os.path.exists(d) and daemon.request("GET", f"/v1/snapshots/{snap['id']}").status == 404,
             timeout=10, what="retention")


@pytest.mark.parametrize("damage", ["truncate", "empty", "bitflip"])
def test_corrupt_snapshot_is_a_typed_error_and_leaks_nothing(daemon, sandbox, damage):
    # No background bake running, so the sandboxes dir holds only ours.
    wait_baked(daemon)
    snap = daemon.request("POST", f"/v1/sandboxes/{sandbox}/snapshots", {}).json()
    img = os.path.join(daemon.data_dir, "snapshots", snap["id"], "checkpoint.img")
    data = open(img, "rb").read()
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "empty":
        data = b""
    else:
        data = data[:1000] + bytes([data[1000] ^ 1]) + data[1001:]
    open(img, "wb").write(data)
    before = len(daemon.request("GET", "/v1/sandboxes").json()["sandboxes"])
    r = daemon.request("POST", f"/v1/snapshots/{snap['id']}/fork", {"count": 2})
    assert r.status == 422 and r.error_code() == "snapshot_corrupt", r
    assert len(daemon.request("GET", "/v1/sandboxes").json()["sandboxes"]) == before
    assert os.listdir(os.path.join(daemon.data_dir, "sandboxes")) == [sandbox]


def test_snapshot_and_fork_bad_input(daemon, sandbox):
    url = f"/v1/sandboxes/{sandbox}/snapshots"
    for body in [{"retention_seconds": 0}, {"retention_seconds": 90 * 24 * 3600 + 1}, {"bogus": 1},
                 {"metadata": {"k": "v" * 513}}, {"memory": "no"}, {"memory": 0}]:
        assert daemon.request("POST", url, body).status == 400, body
    assert daemon.request("POST", "/v1/sandboxes/sbx_doesnotexist0000/snapshots", {}).status == 404
    snap = daemon.request("POST", url, {}).json()
    furl = f"/v1/snapshots/{snap['id']}/fork"
    for body in [{"count": 0}, {"count": 17}, {"ttl_seconds": 0}, {"network": {"egress": "sideways"}},
                 {"network": {"allow": [{"cidr": "1.2.3.4", "host": "a.example"}]}}]:
        assert daemon.request("POST", furl, body).status == 400, body
    r = daemon.request("POST", furl, {"network": {"egress": "deny"}})
    assert r.status == 201, r
    daemon.created.update(s["id"] for s in r.json()["sandboxes"])
    assert daemon.request("POST", "/v1/snapshots/snap_doesnotexist0000/fork", {}).status == 404
    assert daemon.request("GET", "/v1/snapshots/../../etc").status == 404


def test_pool_stays_empty_under_memory_pressure():
    # A threshold no host can meet: the pool must neither fill nor hand out.
    d = Daemon(extra_args=["--pool-size", "2", "--pool-min-available", "1.01"]).start()
    try:
        wait_baked(d)
        time.sleep(2)
        assert metric(d, "hatchery_pool_ready") == 0
        assert create(d)["boot_mode"] == "restore"
    finally:
        d.cleanup()
