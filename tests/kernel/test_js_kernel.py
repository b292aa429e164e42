"""Host-side tests of the run_code JavaScript/TypeScript kernel
(crates/hatchery-agent/src/kernel/js_kernel.js), started as hatchery-agent
starts it (`node --expose-internals -e <source>`, HATCHERY_KERNEL_LANGUAGE,
the same four pipes), with the Python kernel tests' harness.

They need the host's `node`; without it they are skipped, and the same
behaviour is covered inside a sandbox of the `code-interpreter-full`
template by tests/e2b/test_code_interpreter_full.py. The TypeScript tests
also need a `typescript` module (Debian's node-typescript)."""
import os
import shutil
from pathlib import Path

import pytest

import test_python_kernel as harness

NODE = shutil.which("node")
JS_KERNEL = Path(__file__).resolve().parents[2] / "crates/hatchery-agent/src/kernel/js_kernel.js"
TS_MODULES = ["/usr/share/nodejs/typescript", "/usr/lib/node_modules/typescript",
              "/usr/local/lib/node_modules/typescript"]
HAS_TS = any(os.path.exists(os.path.join(p, "package.json")) for p in TS_MODULES)

pytestmark = pytest.mark.skipif(NODE is None, reason="no node on this host (covered in a sandbox by tests/e2b)")


def start(tmp_path, monkeypatch, language):
    monkeypatch.setattr(harness, "argv", lambda: [NODE, "--expose-internals", "-e", JS_KERNEL.read_text()])
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "LANG": "C.UTF-8",
           "HATCHERY_KERNEL_LANGUAGE": language}
    k = harness.Kernel(tmp_path, env=env)
    assert k.ready["type"] == "ready" and k.ready["language"] == language, k.ready
    return k


@pytest.fixture
def kernel(tmp_path, monkeypatch):
    k = start(tmp_path, monkeypatch, "javascript")
    yield k
    k.close()


def out(events, kind="stdout"):
    return harness.text(events, kind)


def main_text(events):
    (res,) = [e for e in harness.results(events) if e["is_main_result"]]
    return res["data"]["text/plain"]


def test_console_log_is_one_stdout_message_per_call(kernel):
    events = kernel.run("console.log('Hello, World!'); console.error('oops'); process.stdout.write('raw')")
    assert [e["text"] for e in events if e["type"] == "stdout"] == ["Hello, World!\n", "raw"]
    assert out(events, "stderr") == "oops\n"
    assert events[-1] == {"id": events[-1]["id"], "type": "done", "execution_count": 1}


def test_the_last_expression_is_the_main_result(kernel):
    assert main_text(kernel.run("1 + 1")) == "2"
    # Strings as E2B's JavaScript kernel shows them: without quotes.
    assert main_text(kernel.run("'a' + 'b'")) == "ab"
    assert main_text(kernel.run("({a: [1, 2], b: 'x'})")) == "{ a: [ 1, 2 ], b: 'x' }"
    assert harness.results(kernel.run("let nothing = 1")) == []
    assert harness.results(kernel.run("undefined")) == []


def test_state_is_kept_across_cells(kernel):
    kernel.run("const x = 1; let y = 2; var z = 3; function f(a) { return a * 10 }; class C { v() { return 7 } }")
    assert main_text(kernel.run("x + y + z + f(1) + new C().v()")) == "23"
    # The kernel's own names are not in the cells' scope: a cell may use them.
    assert harness.errors(kernel.run("const fs = require('fs'); const util = 1; const vm = 2")) == []


def test_top_level_await(kernel):
    events = kernel.run("async function main() { return 'Hello, World!' }\nawait main()")
    assert main_text(events) == "Hello, World!"
    kernel.run("const later = await new Promise(r => setTimeout(() => r(41), 20))")
    assert main_text(kernel.run("later + 1")) == "42"
    events = kernel.run("for (const i of [1, 2]) { await null; console.log(i) }")
    assert out(events) == "1\n2\n" and harness.results(events) == []


def test_errors_have_name_value_and_the_cell_s_traceback(kernel):
    (err,) = harness.errors(kernel.run("let a = 1\nnotDefined + a"))
    assert err["name"] == "ReferenceError" and err["value"] == "notDefined is not defined"
    assert "<cell-1>:2" in err["traceback"] and "[eval]" not in err["traceback"], err["traceback"]
    (err,) = harness.errors(kernel.run("throw new TypeError('bad thing')"))
    assert (err["name"], err["value"]) == ("TypeError", "bad thing")
    (err,) = harness.errors(kernel.run("let = ;"))
    assert err["name"] == "SyntaxError"
    (err,) = harness.errors(kernel.run("await Promise.reject(new RangeError('async'))"))
    assert (err["name"], err["value"]) == ("RangeError", "async")
    (err,) = harness.errors(kernel.run("throw 42"))
    assert (err["name"], err["value"]) == ("Error", "42")
    # The kernel lives on, its state too.
    assert main_text(kernel.run("a")) == "1"


def test_errors_after_a_cell_do_not_end_the_kernel(kernel):
    events = kernel.run("setTimeout(() => { throw new Error('later') }, 0)\n"
                        "Promise.reject(new Error('unhandled'))\n"
                        "await new Promise(r => setTimeout(r, 50)); 'alive'")
    assert main_text(events) == "alive"
    assert "later" in out(events, "stderr") and "unhandled" in out(events, "stderr")


def test_env_is_for_one_run_only(kernel):
    events = kernel.collect(kernel.start("process.env.FOO", env={"FOO": "bar"}))
    assert main_text(events) == "bar"
    assert main_text(kernel.run("process.env.FOO || 'default'")) == "default"
    assert main_text(kernel.run("process.env.HATCHERY_KERNEL_LANGUAGE || 'unset'")) == "unset"


def test_chdir_moves_the_kernel(kernel, tmp_path):
    (tmp_path / "d").mkdir()
    kernel.send({"id": 1, "code": "process.cwd()", "env": {}, "chdir": str(tmp_path / "d")})
    assert main_text(kernel.collect(1)) == str(tmp_path / "d")


def test_display_and_jupyter_display_bundles(kernel):
    events = kernel.run("display({n: 1}); ({[Symbol.for('Jupyter.display')]() {"
                        " return {'text/html': '<b>hi</b>', 'application/json': {k: 1}} }})")
    first, main = harness.results(events)
    assert first["is_main_result"] is False and first["data"]["text/plain"] == "{ n: 1 }"
    assert main["is_main_result"] is True
    assert main["data"]["text/html"] == "<b>hi</b>" and main["data"]["application/json"] == {"k": 1}


def test_children_do_not_hold_the_kernel_s_pipes(kernel):
    code = ("require('child_process').execSync("
            "\"for fd in 3 4; do [ -e /proc/self/fd/$fd ] && echo open $fd; done; echo checked\").toString()")
    assert main_text(kernel.run(code)) == "checked\n"


def test_requests_are_served_in_order(kernel):
    a = kernel.start("await new Promise(r => setTimeout(r, 100)); 'first'")
    b = kernel.start("'second'")
    assert main_text(kernel.collect(a)) == "first"
    assert main_text(kernel.collect(b)) == "second"


def test_a_malformed_request_is_a_kernel_error(kernel):
    kernel.send(b"{not json")
    events = kernel.collect(None)
    assert events[0]["name"] == "KernelError" and events[-1]["type"] == "done"
    assert main_text(kernel.run("'still here'")) == "still here"


def test_closing_the_requests_ends_the_kernel(tmp_path, monkeypatch):
    k = start(tmp_path, monkeypatch, "javascript")
    os.close(k.req_w)
    assert k.proc.wait(timeout=5) == 0
    for fd in (k.ev_r, k.out_r, k.err_r):
        os.close(fd)


@pytest.mark.skipif(not HAS_TS, reason="no typescript module on this host (Debian's node-typescript)")
def test_typescript_types_are_stripped(tmp_path, monkeypatch):
    k = start(tmp_path, monkeypatch, "typescript")
    try:
        events = k.run("function subtract(x: number, y: number): number {\n  return x - y;\n}\n\nsubtract(1, 2);")
        assert main_text(events) == "-1"
        k.run("interface P { n: number }\nconst p: P = { n: 2 }")
        assert main_text(k.run("p.n as number")) == "2"
        assert main_text(k.run("const w: string = await Promise.resolve('awaited'); w")) == "awaited"
        (err,) = harness.errors(k.run("let x: = 1"))
        assert err["name"] == "SyntaxError" and "<cell-4>:1" in err["value"]
    finally:
        k.close()


def test_typescript_without_a_compiler_says_so(tmp_path, monkeypatch):
    # A TypeScript kernel on a Node without the typescript module exits
    # before it is ready, saying why on its stderr (the agent offers no
    # such context; this is the kernel's own check).
    if HAS_TS:
        pytest.skip("this host has a typescript module")
    with pytest.raises(AssertionError, match="event pipe closed; kernel stderr: .*no TypeScript compiler"):
        start(tmp_path, monkeypatch, "typescript")


def test_es_module_imports_become_globals(kernel, tmp_path):
    # E2B's Deno kernel takes static imports; here each is rewritten to
    # `require`, its names global for later cells, line numbers kept.
    (tmp_path / "esm_dep.js").write_text("exports.__esModule = true; exports.default = 'dflt'; exports.two = 2;\n")
    events = kernel.run("import { readFileSync } from 'fs'\nconsole.log(typeof readFileSync)")
    assert out(events) == "function\n" and not harness.errors(events)
    events = kernel.run("import dep, { two as deux } from './esm_dep.js';\nimport * as path from \"path\"\n"
                        "import {\n  sep,\n  join,\n} from 'path'\nimport 'util'\n[dep, deux, path.sep === sep, typeof join]")
    assert main_text(events) == "[ 'dflt', 2, true, 'function' ]"
    assert main_text(kernel.run("import os from 'os'\ntypeof os.cpus")) == "function"  # CommonJS: its exports
    assert main_text(kernel.run("typeof readFileSync")) == "function"  # kept for later cells
    (err,) = harness.errors(kernel.run("import {\n  x,\n} from 'fs'\nnope"))
    assert err["name"] == "ReferenceError" and "<cell-5>:4" in err["traceback"], err
    # Dynamic import() and a string are untouched.
    assert main_text(kernel.run("const s = 'import x from y'\ns")) == "import x from y"
