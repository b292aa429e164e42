"""Host-side tests of the run_code Java kernel
(crates/hatchery-agent/src/kernel/java_kernel.java), started as
hatchery-agent starts it (`java <JVM flags> --source 17 <source>`, the same
pipes) with the Python kernel tests' harness; the agent hands the source
over on a memfd (fd 5), these tests as a file.

They need the host's JDK (`java` and `jshell`); without it they are
skipped, and the same behaviour is covered inside a sandbox of the
`code-interpreter-full` template by tests/e2b/test_code_interpreter_full.py."""
import os
import shutil
from pathlib import Path

import pytest

import test_python_kernel as harness

JAVA, JSHELL = shutil.which("java"), shutil.which("jshell")
SOURCE = Path(__file__).resolve().parents[2] / "crates/hatchery-agent/src/kernel/java_kernel.java"
# kernel.rs's JVM_FLAGS.
FLAGS = ["-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto", "-XX:-UsePerfData", "-Xmx256m"]

pytestmark = pytest.mark.skipif(JAVA is None or JSHELL is None,
                                reason="no JDK on this host (covered in a sandbox by tests/e2b)")


@pytest.fixture
def kernel(tmp_path, monkeypatch):
    monkeypatch.setattr(harness, "argv", lambda: [JAVA, *FLAGS, "--source", "17", str(SOURCE)])
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    k = harness.Kernel(tmp_path, env=env)
    assert k.ready["type"] == "ready" and k.ready["language"] == "java", k.ready
    yield k
    k.close()


def main_text(events):
    (res,) = [e for e in harness.results(events) if e["is_main_result"]]
    return res["data"]["text/plain"]


def test_println_is_its_text_then_its_line_end(kernel):
    events = kernel.run('System.out.println("Hello, World!"); System.err.print("oops")')
    assert [e["text"] for e in events if e["type"] == "stdout"] == ["Hello, World!", "\n"]
    assert harness.text(events, "stderr") == "oops" and harness.results(events) == []
    assert events[-1] == {"id": events[-1]["id"], "type": "done", "execution_count": 1}


def test_state_persists_and_the_last_expression_is_the_result(kernel, tmp_path):
    assert harness.results(kernel.run("int x = 40;\nint add(int a, int b) { return a + b; }")) == []
    assert main_text(kernel.run("add(x, 2)")) == "42"
    assert main_text(kernel.run("List.of(1, 2, 3)")) == "[1, 2, 3]"
    # A string as JShell shows it: quoted (E2B's adapter drops the quotes).
    assert main_text(kernel.run('System.getProperty("user.dir")')) == '"%s"' % tmp_path


def test_env_is_system_properties_for_its_run_only(kernel):
    assert main_text(kernel.run('System.getProperty("FOO")', env={"FOO": "bar"})) == '"bar"'
    assert main_text(kernel.run('System.getProperty("FOO", "default")')) == '"default"'
    kernel.run('System.setProperty("KEEP", "mine")')
    assert main_text(kernel.run('System.getProperty("KEEP")', env={"KEEP": "run"})) == '"run"'
    assert main_text(kernel.run('System.getProperty("KEEP")')) == '"mine"'


def test_errors_and_the_kernel_lives_on(kernel):
    (err,) = harness.errors(kernel.run('throw new IllegalStateException("boom")'))
    assert (err["name"], err["value"]) == ("java.lang.IllegalStateException", "boom")
    assert err["traceback"].startswith("java.lang.IllegalStateException: boom\n")
    (err,) = harness.errors(kernel.run("int z = ;"))
    assert err["name"] == "CompilationError" and err["value"]
    # Snippets after a failing one do not run.
    events = kernel.run('System.out.print("a");\nInteger.parseInt("x");\nSystem.out.print("b");')
    assert harness.text(events) == "a" and harness.errors(events)[0]["name"] == "java.lang.NumberFormatException"
    assert main_text(kernel.run("1 + 1")) == "2"


def test_a_malformed_request_is_a_kernel_error(kernel):
    kernel.send(b'{"id": 1, "code": 5}')
    events = kernel.collect(None)
    assert events[0]["name"] == "KernelError" and events[-1]["type"] == "done"
    assert main_text(kernel.run("3")) == "3"
