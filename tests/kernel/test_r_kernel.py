"""Host-side tests of the run_code R kernel
(crates/hatchery-agent/src/kernel/r_kernel.R), started as hatchery-agent
starts it (`Rscript --vanilla <source>`, the same pipes) with the Python
kernel tests' harness; the agent hands the source over on a memfd (fd 5),
these tests as a file.

They need the host's `Rscript`; without it they are skipped, and the same
behaviour is covered inside a sandbox of the `code-interpreter-full`
template by tests/e2b/test_code_interpreter_full.py."""
import os
import shutil
from pathlib import Path

import pytest

import test_python_kernel as harness

RSCRIPT = shutil.which("Rscript")
SOURCE = Path(__file__).resolve().parents[2] / "crates/hatchery-agent/src/kernel/r_kernel.R"

pytestmark = pytest.mark.skipif(RSCRIPT is None, reason="no Rscript on this host (covered in a sandbox by tests/e2b)")


@pytest.fixture
def kernel(tmp_path, monkeypatch):
    monkeypatch.setattr(harness, "argv", lambda: [RSCRIPT, "--vanilla", str(SOURCE)])
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    k = harness.Kernel(tmp_path, env=env)
    assert k.ready["type"] == "ready" and k.ready["language"] == "r", k.ready
    yield k
    k.close()


def main_text(events):
    (res,) = [e for e in harness.results(events) if e["is_main_result"]]
    return res["data"]["text/plain"]


def test_an_expression_s_output_is_one_chunk(kernel):
    events = kernel.run('print("Hello, World!")\nx <- c(1, 2, 3)\nsum(x)\nmean(x) * 2')
    assert [e["text"] for e in events if e["type"] == "stdout"] == ['[1] "Hello, World!"\n', "[1] 6\n"]
    assert main_text(events) == "[1] 4"
    assert harness.results(kernel.run("y <- x")) == []


def test_env_is_for_its_run_only(kernel):
    assert main_text(kernel.run("Sys.getenv('FOO')", env={"FOO": "bar"})) == '[1] "bar"'
    assert main_text(kernel.run("Sys.getenv('FOO', unset = 'default')")) == '[1] "default"'


def test_errors_and_a_redefined_base_function(kernel):
    (err,) = harness.errors(kernel.run('f <- function() stop("x")\nf()'))
    assert (err["name"], err["value"], err["traceback"]) == ("simpleError", "x", "Error in f(): x\n")
    assert harness.errors(kernel.run("1 +* 2"))[0]["name"] == "SyntaxError"
    # The kernel's own functions are not looked up in the global environment.
    kernel.run("paste0 <- function(...) 'broken'; writeLines <- NULL")
    assert main_text(kernel.run("'é\\t\"q\"'")) == '[1] "é\\t\\"q\\""'


def test_a_long_cell_with_escapes(kernel):
    # json.dumps escapes é as \u00e9 (serde_json only control characters);
    # R's parser refuses such a string of over 10000 characters.
    assert main_text(kernel.run("s <- '%s\x01'; nchar(s)" % ("é" * 12000))) == "[1] 12001"
