"""`make install` into a scratch root (DESTDIR): the tree a systemd
machine gets, checked file by file. Each unit runs a binary that is in the
tree, with a config whose example is in the tree; the installed hatcheryd
accepts every example (`config check`, which reads the file without
connecting anywhere); a second install changes nothing an operator wrote.
No daemon is started (no sandbox either)."""

import os
import re
import stat
import subprocess
import sys

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "integration"))

from harness import BIN_DIR  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BINS = ["hatcheryd", "hatchery", "hatchery-agent", "hatchery-shim"]
UNITS = {"hatchery.service": "all", "hatchery-control.service": "control", "hatchery-host.service": "host"}


def install(root):
    r = subprocess.run(["make", "-s", "-C", REPO, "install", f"DESTDIR={root}", "INSTALL_PREREQS=",
                        f"BIN={os.path.abspath(BIN_DIR)}"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def mode(p):
    return stat.S_IMODE(os.stat(p).st_mode)


def test_make_install_lays_out_binaries_units_and_example_configs(tmp_path):
    root = str(tmp_path / "root")
    install(root)
    for b in BINS:
        p = f"{root}/opt/hatchery/bin/{b}"
        assert os.path.isfile(p) and mode(p) == 0o755, p
        with open(p, "rb") as f, open(os.path.join(BIN_DIR, b), "rb") as g:
            assert f.read() == g.read(), f"{b} is not the built one"
    assert mode(f"{root}/etc/hatchery") == 0o750
    for unit, role in UNITS.items():
        text = open(f"{root}/etc/systemd/system/{unit}").read()
        [exec_start] = re.findall(r"^ExecStart=(.*)$", text, re.M)
        binary, flag, config = exec_start.split()
        assert flag == "--config" and os.access(root + binary, os.X_OK), exec_start
        assert config == f"/etc/hatchery/{role}.toml", exec_start
        example = f"{root}{config}.example"
        # 0600: the control and host examples hold a database URL with its
        # password once filled in.
        assert mode(example) == 0o600, example
        # Stopping waits for the stop grace; the unit waits longer.
        assert int(re.search(r"^TimeoutStopSec=(\d+)", text, re.M).group(1)) > 30
        if role != "control":
            assert "KillMode=process" in text, unit
        r = subprocess.run([root + binary, "config", "check", example], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, (example, r.stdout, r.stderr)
    # What the `all` example listens on is not `make run`'s port.
    assert 'listen = "127.0.0.1:7433"' in open(f"{root}/etc/hatchery/all.toml.example").read()

    # An operator's config survives a second install; the examples are
    # refreshed.
    mine = f"{root}/etc/hatchery/host.toml"
    with open(mine, "w") as f:
        f.write("# mine\n")
    install(root)
    assert open(mine).read() == "# mine\n"
    assert sorted(os.listdir(f"{root}/etc/hatchery")) == sorted(
        [f"{r}.toml.example" for r in UNITS.values()] + ["host.toml"])
