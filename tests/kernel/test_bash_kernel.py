"""Host-side tests of the run_code Bash kernel (crates/hatchery-agent/src/kernel/bash_kernel.py),
started as hatchery-agent starts it, with the Python kernel tests' harness."""
from pathlib import Path

import pytest

import test_python_kernel as harness

BASH_KERNEL = Path(__file__).resolve().parents[2] / "crates/hatchery-agent/src/kernel/bash_kernel.py"


@pytest.fixture
def kernel(tmp_path, monkeypatch):
    monkeypatch.setattr(harness, "KERNEL", BASH_KERNEL)
    k = harness.Kernel(tmp_path)
    assert k.ready["language"] == "bash"
    yield k
    k.close()


def out(events, kind="stdout"):
    return harness.text(events, kind)


def test_state_persists_between_runs(kernel, tmp_path):
    assert out(kernel.run("x=41; f() { echo $((x + $1)); }; cd /")) == ""
    events = kernel.run("f 1; pwd")
    assert out(events) == "42\n/\n" and events[-1]["type"] == "done"


def test_stdout_stderr_and_no_trailing_newline(kernel):
    events = kernel.run("echo out; echo err >&2; printf 'no end'")
    assert out(events) == "out\nno end" and out(events, "stderr") == "err\n"


def test_code_cannot_read_the_kernel_s_input(kernel):
    # stdin is /dev/null: a `cat` ends at once instead of eating the next run.
    assert out(kernel.run("cat; echo after")) == "after\n"
    assert out(kernel.run("echo next")) == "next\n"


def test_env_is_for_one_run_only(kernel):
    kernel.run("export KEEP=base")
    events = kernel.collect(kernel.start("echo $FOO $KEEP", env={"FOO": "it's", "KEEP": "over"}))
    assert out(events) == "it's over\n"
    assert out(kernel.run("echo ${FOO:-unset} $KEEP")) == "unset base\n"


def test_chdir_and_here_documents(kernel, tmp_path):
    (tmp_path / "d").mkdir()
    kernel.send({"id": 1, "code": "cat <<'EOF'\nliteral $HOME\nEOF\npwd", "env": {}, "chdir": str(tmp_path / "d")})
    assert out(kernel.collect(1)) == "literal $HOME\n%s\n" % (tmp_path / "d")
