"""Templates built at start (`--build-template`, issue 35): the daemon
answers at once, shows the template `building` through the API and the CLI,
answers a create naming it 503 `template_building` with Retry-After (v1 and
E2B, each in its own error shape) until the build is done, then creates
work; a second start with the same spec builds nothing. A bad spec file
stops the daemon before it starts. Real runsc, real checkpoint."""

import glob
import json
import os
import shutil
import subprocess
import tempfile
import time

import pytest

from harness import BIN_DIR, KEY, TEMPLATES_DIR, Daemon

NAME = "tpl-at-start"
# No packages: the default template's rootfs serves (seeded below), so the
# build is the checkpoint bake alone, which the sleep keeps long enough to
# be seen in progress.
SPEC = {"name": NAME, "setup": ["sleep 6", "echo built-at-start > /opt/mark"], "memory_mb": 256}


def seed_rootfs(templates_dir, name):
    """The default template's rootfs for template `name` (the rootfs key is
    base and packages alone), as tests/sdk/support.py seed_rootfs does, so no
    debootstrap runs."""
    src = glob.glob(os.path.join(TEMPLATES_DIR, "code-interpreter", "rootfs-*"))[0]
    dst = os.path.join(templates_dir, name)
    os.makedirs(dst, exist_ok=True)
    subprocess.run(["cp", "-a", src, dst], check=True)


@pytest.fixture
def tdir():
    d = tempfile.mkdtemp(prefix="hxtas-", dir="/tmp")
    seed_rootfs(d, NAME)
    with open(os.path.join(d, "spec.json"), "w") as f:
        json.dump(SPEC, f)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def cli(d, *args):
    return subprocess.run([os.path.join(BIN_DIR, "hatchery"), *args],
                          env=dict(os.environ, HATCHERY_URL=f"http://127.0.0.1:{d.port}", HATCHERY_API_KEY=KEY),
                          capture_output=True, text=True, timeout=60)


@pytest.mark.timeout(300)
def test_a_template_built_at_start_is_building_then_ready(tdir):
    spec_path = os.path.join(tdir, "spec.json")
    d = Daemon(extra_args=["--pool-size", "0", "--build-template", spec_path], templates_dir=tdir).start()
    try:
        # Serving at once, the template listed as building.
        listed = {t["name"]: t for t in d.request("GET", "/v1/templates").json()["templates"]}
        t = listed[NAME]
        assert t["state"] == "building" and t["checkpoint_ready"] is False, t
        assert t["setup"] == SPEC["setup"] and t["memory_mb"] == 256
        b = t["build"]
        assert b["events_url"] == f"/v1/templates/{NAME}/builds/{b['build_id']}/events"
        assert b["version"] == t["version"] and 0 <= b["percent"] < 100, b
        one = d.request("GET", f"/v1/templates/{NAME}").json()
        assert one["state"] == "building" and one["build"]["build_id"] == b["build_id"], one

        # The CLI shows it.
        ls = cli(d, "template", "ls")
        assert ls.returncode == 0, ls.stderr
        row = [line for line in ls.stdout.splitlines() if line.startswith(NAME)]
        assert row and "building" in row[0] and "STATE" in ls.stdout, ls.stdout

        # A create naming it: retry later, not "not found"; in each API's shape.
        r = d.request("POST", "/v1/sandboxes", {"template": NAME})
        assert r.status == 503 and r.error_code() == "template_building", r
        assert r.headers.get("retry-after") == "5", r.headers
        assert NAME in r.json()["error"]["message"]
        r = d.request("POST", "/e2b/sandboxes", {"templateID": NAME}, auth=False, headers={"X-API-Key": KEY})
        assert r.status == 503, r
        assert r.json()["code"] == 503 and "being built" in r.json()["message"], r.json()
        assert r.headers.get("retry-after") == "5", r.headers
        # An unknown template is still 404, in both.
        r = d.request("POST", "/v1/sandboxes", {"template": "tpl-nowhere"})
        assert r.status == 404 and r.error_code() == "template_not_found", r
        r = d.request("POST", "/e2b/sandboxes", {"templateID": "tpl-nowhere"}, auth=False,
                      headers={"X-API-Key": KEY})
        assert r.status == 404, r

        # The build's events, from the start, to done.
        events = d.stream(None, None, path=b["events_url"], method="GET", timeout=240)
        assert events[-1][0] == "done", events[-5:]
        assert events[-1][1]["version"] == b["version"]
        # No debootstrap: the seeded rootfs was reused.
        assert any("rootfs already built" in e.get("line", "") for k, e in events if k == "log"), events[:5]

        t = d.request("GET", f"/v1/templates/{NAME}").json()
        assert (t["state"], t["build"], t["checkpoint_ready"]) == ("ready", None, True), t
        sid = d.create(template=NAME)
        assert d.exec(sid, "cat /opt/mark")["stdout"] == "built-at-start\n"
        d.delete(sid)
    finally:
        d.cleanup()

    # The next start with the same spec: current, nothing to build.
    d = Daemon(extra_args=["--pool-size", "0", "--build-template", spec_path], templates_dir=tdir).start()
    try:
        t = d.request("GET", f"/v1/templates/{NAME}").json()
        assert (t["state"], t["build"]) == ("ready", None), t
        time.sleep(0.5)
        assert "template to build at start is current" in d.log(tail=None)
        assert "template build queued" not in d.log(tail=None)
        sid = d.create(template=NAME)
        d.delete(sid)
    finally:
        d.cleanup()


def test_a_bad_spec_file_is_a_start_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "Not A Name"}')
    for spec, says in [(tmp_path / "missing.json", "cannot read it"), (bad, "invalid template spec")]:
        p = subprocess.run([os.path.join(BIN_DIR, "hatcheryd"), "--data-dir", str(tmp_path / "data"),
                            "--listen", "127.0.0.1:9", "--build-template", str(spec)],
                           capture_output=True, text=True, timeout=30)
        assert p.returncode != 0, p
        assert "--build-template" in p.stderr and str(spec) in p.stderr and says in p.stderr, p.stderr
        # Refused before it started anything.
        assert not (tmp_path / "data").exists()
    # In a configuration file: the key and the file named.
    conf = tmp_path / "hatchery.toml"
    conf.write_text(f'[templates]\nbuild_at_start = ["{bad}"]\n')
    p = subprocess.run([os.path.join(BIN_DIR, "hatcheryd"), "--config", str(conf)],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode != 0, p
    assert str(conf) in p.stderr and "`templates.build_at_start`" in p.stderr and str(bad) in p.stderr, p.stderr
