"""`hatchery template build|ls|get|rm`, on a daemon of its own with a copy of
the default template (so a rebuild reuses its rootfs and skips debootstrap)."""

import json
import os
import shutil
import subprocess
import tempfile

import pytest

from cli import Cli
from harness import TEMPLATES_DIR, Daemon


@pytest.fixture(scope="module")
def builder():
    tdir = tempfile.mkdtemp(prefix="hxtpl-", dir="/tmp")
    subprocess.run(["cp", "-a", os.path.join(TEMPLATES_DIR, "code-interpreter"), tdir], check=True)
    d = Daemon(extra_args=["--pool-size", "0"], templates_dir=tdir).start()
    yield d
    d.cleanup()
    shutil.rmtree(tdir, ignore_errors=True)


@pytest.fixture
def tx(builder):
    cli = Cli(builder)
    yield cli
    left = cli.live()
    for sid in left:
        builder.delete(sid)
    assert left == [], f"sandboxes left behind by the test: {left}"


def spec_file(tmp_path, **kw):
    f = tmp_path / "spec.json"
    f.write_text(json.dumps(dict({"name": "code-interpreter"}, **kw)))
    return str(f)


def test_ls_and_get(tx):
    table = tx("template", "ls", check=0).stdout.splitlines()
    assert table[0].split() == ["NAME", "VERSION", "CPUS", "MEMORY_MB", "PACKAGES", "CHECKPOINT", "STATE"]
    assert table[1].split()[0] == "code-interpreter" and table[1].split()[-1] == "ready"
    listed = json.loads(tx("template", "ls", "--json", check=0).stdout)
    assert [t["name"] for t in listed] == ["code-interpreter"]
    got = json.loads(tx("template", "get", "code-interpreter", "--json", check=0).stdout)
    assert got["version"] == listed[0]["version"]
    assert f"version:          {got['version']}" in tx("template", "get", "code-interpreter", check=0).stdout
    p = tx("template", "get", "nope")
    assert p.returncode == 1 and "template_not_found" in p.stderr


def test_build_with_progress_then_use_then_remove(tx, tmp_path):
    before = json.loads(tx("template", "get", "code-interpreter", "--json", check=0).stdout)["version"]
    spec = spec_file(tmp_path, files={"/opt/greeting": "hello\n"}, setup=["echo built > /opt/setup"])
    p = tx("template", "build", spec, timeout=600)
    assert p.returncode == 0, p.stderr
    version = p.stdout.strip()
    assert len(version) == 16 and version != before
    assert "building" in p.stderr and "setup" in p.stderr and "100% done" in p.stderr and "[####" in p.stderr
    assert json.loads(tx("template", "ls", "--json", check=0).stdout)[0]["version"] == version
    sid = tx.create("--template", "code-interpreter")
    assert tx("exec", sid, "--", "cat /opt/greeting /opt/setup", check=0).stdout == "hello\nbuilt\n"

    # A failing setup step fails the build and keeps the version.
    p = tx("template", "build", spec_file(tmp_path, setup=["exit 3"]), timeout=600)
    assert p.returncode == 1 and "build failed" in p.stderr and "setup[0] exited with 3" in p.stderr
    assert json.loads(tx("template", "get", "code-interpreter", "--json", check=0).stdout)["version"] == version

    p = tx("template", "rm", "code-interpreter")
    assert p.returncode == 1 and "conflict" in p.stderr
    tx("sandbox", "kill", sid, check=0)
    assert tx("template", "rm", "code-interpreter", check=0).stdout.strip() == "code-interpreter"
    assert json.loads(tx("template", "ls", "--json", check=0).stdout) == []
    p = tx("template", "rm", "code-interpreter")
    assert p.returncode == 1 and "template_not_found" in p.stderr


def test_build_rejections(tx, tmp_path):
    p = tx("template", "build", spec_file(tmp_path, name="Bad Name"))
    assert p.returncode == 1 and "invalid_template_name" in p.stderr
    p = tx("template", "build", spec_file(tmp_path, bogus=True))
    assert p.returncode == 1 and "invalid_json" in p.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    p = tx("template", "build", str(bad))
    assert p.returncode == 1 and "spec is not JSON" in p.stderr
    p = tx("template", "build", str(tmp_path / "missing.json"))
    assert p.returncode == 1 and "reading" in p.stderr
