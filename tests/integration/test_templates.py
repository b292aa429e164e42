"""Templates as data: a build from a spec (packages, files, setup), its
progress stream, versions on rebuild, and deletion, end to end with
debootstrap from the Debian mirror and real runsc checkpoints."""

import json
import os
import shutil
import subprocess
import tempfile

import pytest

from harness import BIN_DIR, KEY, Daemon

SPEC = {
    "name": "tpl-jq",
    "packages": ["jq"],
    "files": {"/opt/greeting.txt": "hello from the template\n"},
    "setup": [
        "python3 -c \"open('/opt/setup-ran', 'w').write('v1')\"",
        "jq --version > /opt/jq-version",
    ],
    "memory_mb": 256,
    "pids_max": 64,
}


@pytest.fixture
def builder():
    tdir = tempfile.mkdtemp(prefix="hxtpl-", dir="/tmp")
    d = Daemon(extra_args=["--pool-size", "0"], templates_dir=tdir).start()
    yield d
    d.cleanup()
    shutil.rmtree(tdir, ignore_errors=True)


def build(d, spec):
    r = d.request("POST", "/v1/templates", spec)
    assert r.status == 202, r
    acc = r.json()
    events = d.stream(None, None, path=acc["events_url"], method="GET", timeout=600)
    return acc, events


# Longer than the default: it builds templates through the API and the CLI.
@pytest.mark.timeout(1200)
def test_build_use_rebuild_delete(builder):
    d = builder
    acc, events = build(d, SPEC)
    kinds = [k for k, _ in events]
    assert kinds[-1] == "done", events[-5:]
    steps = [e["step"] for k, e in events if k == "step"]
    assert steps[0] == "rootfs" and "setup" in steps and steps[-1] == "activate"
    percents = [e["percent"] for k, e in events if k == "step"]
    assert percents == sorted(percents)
    assert any("jq" in e["line"] for k, e in events if k == "log")
    v1 = events[-1][1]["version"]
    assert v1 == acc["version"]

    t = d.request("GET", "/v1/templates/tpl-jq").json()
    assert (t["version"], t["packages"], t["memory_mb"], t["checkpoint_ready"]) == (v1, ["jq"], 256, True)
    assert t["files"] == ["/opt/greeting.txt"]
    assert "tpl-jq" in [x["name"] for x in d.request("GET", "/v1/templates").json()["templates"]]

    r = d.request("POST", "/v1/sandboxes", {"template": "tpl-jq"})
    assert r.status == 201, r
    old = r.json()
    d.created.add(old["id"])
    assert old["boot_mode"] == "restore"
    out = d.exec(old["id"], "jq -n '1+1'; cat /opt/greeting.txt /opt/setup-ran; echo; cat /opt/jq-version")["stdout"]
    assert out.startswith("2\nhello from the template\nv1\njq-"), out

    # A late subscriber gets the whole history.
    replay = d.stream(None, None, path=acc["events_url"], method="GET")
    assert [k for k, _ in replay] == kinds

    # Rebuild: new version, same rootfs (only setup changed), running
    # sandboxes unaffected.
    # This time through the CLI, which follows the same event stream.
    spec2 = dict(SPEC, setup=["python3 -c \"open('/opt/setup-ran', 'w').write('v2')\""])
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(spec2, f)
        f.flush()
        cli = subprocess.run([os.path.join(BIN_DIR, "hatchery"), "template", "build", f.name],
                             env=dict(os.environ, HATCHERY_URL=f"http://127.0.0.1:{d.port}", HATCHERY_API_KEY=KEY),
                             capture_output=True, text=True, timeout=600)
    assert cli.returncode == 0, cli.stderr
    v2 = cli.stdout.strip()
    assert v2 and v2 != v1
    assert "100% done" in cli.stderr and "setup" in cli.stderr
    new = d.create(template="tpl-jq")
    assert d.exec(new, "cat /opt/setup-ran")["stdout"] == "v2"
    assert d.exec(old["id"], "cat /opt/setup-ran")["stdout"] == "v1"
    # A snapshot taken after the rebuild of the sandbox booted on v1 is of
    # v1: its fork runs on v1's rootfs, not the template's current one.
    old_snap = d.request("POST", f"/v1/sandboxes/{old['id']}/snapshots", {}).json()["id"]
    r = d.request("POST", f"/v1/snapshots/{old_snap}/fork", {"count": 1})
    assert r.status == 201, r
    fork = r.json()["sandboxes"][0]["id"]
    d.created.add(fork)
    assert d.exec(fork, "cat /opt/setup-ran")["stdout"] == "v1"
    d.delete(fork)
    assert d.request("DELETE", f"/v1/snapshots/{old_snap}").status == 204

    # A failing setup step fails the build and leaves the current version.
    _, bad = build(d, dict(SPEC, setup=["echo about to fail; exit 3"]))
    assert bad[-1][0] == "error" and "setup[0] exited with 3" in bad[-1][1]["error"]["message"]
    assert any(e.get("line") == "about to fail" for k, e in bad if k == "log")
    assert d.request("GET", "/v1/templates/tpl-jq").json()["version"] == v2

    r = d.request("DELETE", "/v1/templates/tpl-jq")
    assert r.status == 409 and r.error_code() == "conflict"
    snap = d.request("POST", f"/v1/sandboxes/{new}/snapshots", {}).json()["id"]
    for s in (old["id"], new):
        d.delete(s)
    # Forks need the rootfs a snapshot was taken on.
    r = d.request("DELETE", "/v1/templates/tpl-jq")
    assert r.status == 409 and "snapshots" in r.json()["error"]["message"]
    assert d.request("DELETE", f"/v1/snapshots/{snap}").status == 204
    assert d.request("DELETE", "/v1/templates/tpl-jq").status == 204
    assert d.request("GET", "/v1/templates/tpl-jq").status == 404
    assert d.request("POST", "/v1/sandboxes", {"template": "tpl-jq"}).status == 404


def test_build_rejections(builder):
    d = builder
    for body in [
        {"name": "Bad Name"},
        {"name": "x", "packages": ["jq; rm -rf /"]},
        {"name": "x", "base": "alpine"},
        {"name": "x", "files": {"relative": "x"}},
        {"name": "x", "setup": [""]},
        {"name": "x", "memory_mb": 10},
        {"name": "x", "network": {"egress": "allow"}},
        {"name": "x", "bogus": True},
    ]:
        r = d.request("POST", "/v1/templates", body)
        assert r.status == 400, (body, r)
    assert d.request("GET", "/v1/templates/nope").status == 404
    assert d.request("GET", "/v1/templates/x/builds/bld_nope/events").status == 404


def test_cli_says_how_to_start_a_missing_daemon(tmp_path):
    spec = tmp_path / "t.json"
    spec.write_text(json.dumps({"name": "x"}))
    cli = subprocess.run([os.path.join(BIN_DIR, "hatchery"), "template", "build", str(spec)],
                         env=dict(os.environ, HATCHERY_URL="http://127.0.0.1:9", HATCHERY_API_KEY="k"),
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode != 0
    assert "cannot reach the daemon" in cli.stderr and "make run" in cli.stderr
