"""What the CLI says when it cannot do its job: no daemon, wrong or missing
key, bad usage."""

import subprocess

import pytest

from cli import HATCHERY
from harness import free_port

CLIENT_COMMANDS = [
    (["sandbox", "ls"], 1),
    (["sandbox", "create"], 1),
    (["exec", "sbx_0000000000000000", "--", "true"], 125),
    (["exec", "--background", "sbx_0000000000000000", "--", "true"], 125),
    (["ps", "sbx_0000000000000000"], 1),
    (["attach", "sbx_0000000000000000", "proc_0000000000000000"], 125),
    (["wait", "sbx_0000000000000000", "proc_0000000000000000"], 125),
    (["kill", "sbx_0000000000000000", "proc_0000000000000000"], 1),
    (["cp", "/etc/hostname", "sbx_0000000000000000:/tmp/x"], 1),
    (["shell", "sbx_0000000000000000"], 1),
    (["run", "/etc/hostname", "--interpreter", "cat"], 125),
    (["snapshot", "ls"], 1),
    (["template", "ls"], 1),
    (["network", "get", "sbx_0000000000000000"], 1),
]


def run(args, **env):
    return subprocess.run([HATCHERY, *args], capture_output=True, text=True, timeout=60, input="",
                          env={"PATH": "/usr/bin:/bin", **env})


@pytest.mark.parametrize("args,code", CLIENT_COMMANDS)
def test_no_daemon_says_how_to_start_one(args, code):
    port = free_port()  # nothing listens there
    p = run(args, HATCHERY_URL=f"http://127.0.0.1:{port}", HATCHERY_API_KEY="k")
    assert p.returncode == code, p
    assert f"cannot reach the daemon at http://127.0.0.1:{port}" in p.stderr, p.stderr
    assert "make run" in p.stderr and "hatchery serve" in p.stderr


def test_no_key_says_where_it_looked(tmp_path, hx):
    p = run(["sandbox", "ls"], HATCHERY_URL=hx.env["HATCHERY_URL"], HATCHERY_KEY_FILE=str(tmp_path / "api_key"))
    assert p.returncode == 1
    assert "HATCHERY_API_KEY" in p.stderr and str(tmp_path / "api_key") in p.stderr
    # The key file works when it holds the daemon's key.
    (tmp_path / "api_key").write_text(hx.env["HATCHERY_API_KEY"] + "\n")
    p = run(["sandbox", "ls", "--json"], HATCHERY_URL=hx.env["HATCHERY_URL"],
            HATCHERY_KEY_FILE=str(tmp_path / "api_key"))
    assert (p.returncode, p.stdout.strip()) == (0, "[]"), p.stderr
    # So do the flags, in any position.
    p = run(["sandbox", "ls", "--url", hx.env["HATCHERY_URL"], "--api-key", hx.env["HATCHERY_API_KEY"]])
    assert p.returncode == 0, p.stderr


def test_wrong_key(hx):
    p = hx("sandbox", "ls", env={"HATCHERY_API_KEY": "wrong"})
    assert p.returncode == 1 and "401 unauthorized" in p.stderr and "HATCHERY_API_KEY" in p.stderr


def test_usage_errors_and_help():
    for args in (["nope"], ["sandbox"], ["exec"], ["cp", "only-one"], ["snapshot", "fork"], [],
                 ["network", "set", "sbx_0000000000000000", "--policy", "{}", "--egress", "allow"]):
        p = run(args)
        assert p.returncode == 2, (args, p)
    p = run(["--help"])
    assert p.returncode == 0
    for sub in ("sandbox", "exec", "cp", "shell", "run", "snapshot", "template", "network", "serve"):
        assert f"\n  {sub} " in p.stdout, sub
    assert run(["--version"]).stdout.startswith("hatchery ")


def test_serve_execs_the_daemon_beside_it(tmp_path):
    # Every argument reaches hatcheryd, --version and --help included: the
    # CLI links no daemon code, it execs the binary next to it.
    p = run(["serve", "--version"])
    assert (p.returncode, p.stdout.split()[0]) == (0, "hatcheryd"), p
    p = run(["serve", "--help"])
    assert p.returncode == 0 and "--data-dir" in p.stdout and "--config" in p.stdout, p
    # A CLI installed alone, with no hatcheryd on PATH either, says so.
    alone = tmp_path / "hatchery"
    alone.write_bytes(open(HATCHERY, "rb").read())
    alone.chmod(0o755)
    p = subprocess.run([str(alone), "serve"], capture_output=True, text=True, timeout=60,
                       env={"PATH": str(tmp_path)})
    assert p.returncode == 1 and "no hatcheryd next to" in p.stderr, p
