"""hatcheryd's configuration file at the binary: `config example` for each
role passes `config check`; a broken file exits 2 with every problem named
by key and file; a flag beats the file. (The daemons of tests/cli, and of any
suite run with HATCHERY_TEST_CONFIG_FILE=1, are configured by files: see
config_file.py.) No daemon is started here."""

import os
import subprocess

from harness import BIN_DIR

HATCHERYD = os.path.join(BIN_DIR, "hatcheryd")


def hatcheryd(*args):
    # No HATCHERY_* variable of the test runner's: they would beat the file.
    return subprocess.run([HATCHERYD, *args], capture_output=True, text=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin"})


def test_each_role_s_example_passes_the_check(tmp_path):
    for role in ("all", "host", "control"):
        p = hatcheryd("config", "example", "--role", role)
        assert p.returncode == 0, p
        assert f'name = "{role}"' in p.stdout or role == "all", p.stdout
        f = tmp_path / f"{role}.toml"
        f.write_text(p.stdout)
        p = hatcheryd("config", "check", str(f))
        assert (p.returncode, p.stdout) == (0, f"{f}: ok\n"), p


def test_a_broken_file_names_every_problem(tmp_path):
    f = tmp_path / "h.toml"
    f.write_text('[pool]\nsize = "four"\nsise = 1\n[role]\nname = "host"\n[nope]\n')
    for argv in (["config", "check", str(f)], ["--config", str(f)]):
        p = hatcheryd(*argv)
        assert p.returncode == 2, p
        lines = p.stderr.splitlines()
        assert lines[0].startswith("hatcheryd: configuration: "), p.stderr
        for needle in ("unknown key `pool.sise`", "unknown key `nope`",
                       "`pool.size` must be an integer, not a string",
                       "`role.name`: `host` needs --db postgres"):
            assert any(f"{f}: " in line and needle in line for line in lines), (needle, p.stderr)
    f.write_text("[pool\n")
    p = hatcheryd("config", "check", str(f))
    assert p.returncode == 2 and "not valid TOML" in p.stderr and "line 1" in p.stderr, p


def test_a_flag_beats_the_file(tmp_path):
    f = tmp_path / "h.toml"
    f.write_text('[role]\nname = "control"\n')
    p = hatcheryd("--config", str(f))
    assert p.returncode == 2 and f"{f}: `role.name`: `control` needs --db" in p.stderr, p
    # The flag's value is the one the rule judged, and it names the flag.
    p = hatcheryd("--config", str(f), "--role", "host")
    assert p.returncode == 2 and "--role: `host` needs --db" in p.stderr, p
    p = subprocess.run([HATCHERYD, "--config", str(f)], capture_output=True, text=True, timeout=30,
                       env={"PATH": "/usr/bin:/bin", "HATCHERY_ROLE": "host"})
    assert p.returncode == 2 and "HATCHERY_ROLE: `host` needs --db" in p.stderr, p
