"""`e2b-code-interpreter` (the official Python SDK) on the
`code-interpreter-full` template (templates/code-interpreter-full.json:
numpy, pandas, matplotlib, IPython, Node, TypeScript, R and a JDK from
Debian; issue 35): JavaScript and TypeScript contexts in a warm Node
process, Python's scientific stack with PNG charts and display data, and
R (Rscript) and Java (JShell in one JVM) contexts started on first use.

The template is built through the API of the suite's daemon on the rootfs
that `make full-template` keeps in the test cache (harness.full_templates,
built there if missing), so only its setup and checkpoint run here."""

import json
import os
import time

import pytest
from e2b import TimeoutException

import harness
from harness import wait_for

HERE = os.path.dirname(os.path.abspath(__file__))
FULL_SPEC = json.load(open(os.path.join(HERE, "..", "..", "templates", "code-interpreter-full.json")))
NAME = FULL_SPEC["name"]


@pytest.fixture(scope="module")
def full_template(daemon):
    harness.seed_cached_rootfs(daemon.templates_dir, FULL_SPEC, harness.full_templates())
    r = daemon.request("POST", "/v1/templates", FULL_SPEC)
    assert r.status == 202, r
    events = daemon.stream(None, None, path=r.json()["events_url"], method="GET", timeout=900)
    assert events[-1][0] == "done", events[-5:]
    wait_for(lambda: daemon.request("GET", f"/v1/templates/{NAME}").json().get("state") == "ready",
             timeout=60, what="code-interpreter-full ready")
    return NAME


@pytest.fixture
def full(full_template):
    from e2b_code_interpreter import Sandbox
    s = Sandbox.create(full_template, timeout=300)
    yield s
    s.kill()


def test_js_runs_in_node_with_the_last_expression_as_result(full):
    ex = full.run_code("1+1", language="js")
    assert ex.text == "2" and ex.error is None
    assert full.run_code("'a' + 'b'", language="javascript").text == "ab"
    assert full.run_code("process.version", language="js").text.startswith("v18.")


def test_js_state_is_kept_across_cells(full):
    assert full.run_code("const x = 40; function add(a, b) { return a + b }", language="js").text is None
    assert full.run_code("add(x, 2)", language="js").text == "42"
    # Top-level await, and declarations made under it, as E2B's kernel.
    full.run_code("const later = await new Promise(r => setTimeout(() => r(7), 10))", language="js")
    assert full.run_code("async function main() { return later * 6 }\nawait main()", language="js").text == "42"


def test_console_log_streams(full):
    seen = []
    ex = full.run_code("console.log('Hello, World!')\nawait new Promise(r => setTimeout(r, 1500))\nconsole.log('b')",
                       language="js", on_stdout=lambda m: seen.append((m.line, time.monotonic())))
    done = time.monotonic()
    assert ex.logs.stdout == ["Hello, World!\n", "b\n"]
    assert [line for line, _ in seen] == ["Hello, World!\n", "b\n"]
    # The first line arrived while the cell was still running.
    assert done - seen[0][1] > 1.0, seen
    assert full.run_code("console.error('e')", language="js").logs.stderr == ["e\n"]


def test_js_es_module_imports(full):
    # E2B's suite (test_js_esm_imports): a static import in a JS cell.
    ex = full.run_code("import { readFileSync } from 'fs'\nconsole.log(typeof readFileSync)", language="js")
    assert ex.logs.stdout == ["function\n"] and ex.error is None


def test_js_errors_have_name_and_value(full):
    ex = full.run_code("let a = 1\nnotDefined + a", language="js")
    assert ex.error.name == "ReferenceError" and ex.error.value == "notDefined is not defined"
    assert "<cell-" in ex.error.traceback
    ex = full.run_code("throw new TypeError('bad thing')", language="js")
    assert (ex.error.name, ex.error.value) == ("TypeError", "bad thing")
    # The context lives on.
    assert full.run_code("a", language="js").text == "1"


def test_js_contexts_cwd_and_env(full):
    assert full.run_code("process.cwd()", language="js").text == "/home/user"
    ctx = full.create_code_context(cwd="/home", language="js")
    assert (ctx.language, ctx.cwd) == ("javascript", "/home")
    assert full.run_code("process.cwd()", context=ctx).text == "/home"
    assert full.run_code("typeof x", context=ctx).text == "undefined"
    assert full.run_code("process.env.FOO", envs={"FOO": "bar"}, language="js").text == "bar"
    assert full.run_code("process.env.FOO || 'default'", language="js").text == "default"
    assert "javascript" in [c.language for c in full.list_code_contexts()]


def test_typescript_types_are_stripped(full):
    ex = full.run_code("function subtract(x: number, y: number): number {\n  return x - y;\n}\n\nsubtract(1, 2);",
                       language="ts")
    assert ex.text == "-1" and ex.error is None
    full.run_code("interface P { n: number }\nconst p: P = { n: 2 }", language="typescript")
    assert full.run_code("p.n as number", language="ts").text == "2"
    assert full.run_code("let y: = 1", language="ts").error.name == "SyntaxError"


def test_a_js_run_past_its_timeout_restarts_the_context(full):
    full.run_code("const kept = 1", language="js")
    with pytest.raises(TimeoutException):
        full.run_code("while (true) {}", language="js", timeout=3)
    t0 = time.monotonic()
    # Stopped (its unit killed), so this one does not wait behind it; the
    # context starts clean.
    assert full.run_code("typeof kept", language="js", timeout=30).text == "undefined"
    assert time.monotonic() - t0 < 30


def test_the_scientific_stack(full):
    ex = full.run_code("import numpy as np, pandas as pd\n"
                       "df = pd.DataFrame({'a': np.arange(4)})\nint(df.a.sum())")
    assert ex.text == "6" and ex.error is None
    # A pandas frame shows as HTML too, as in Jupyter.
    ex = full.run_code("df")
    assert ex.results[0].html and "<table" in ex.results[0].html


def test_a_matplotlib_chart_is_a_png_result(full):
    ex = full.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.title('t')\nplt.show()")
    assert ex.error is None, ex.error
    (res,) = ex.results
    assert res.png and res.png.startswith("iVBORw0KGgo"), res
    assert not res.is_main_result


def test_charts_carry_their_data(full):
    """`Result.chart`: what E2B's interpreter extracts from a shown figure,
    read back by the SDK's chart classes."""
    from e2b_code_interpreter.charts import (BarChart, BoxAndWhiskerChart, ChartType, LineChart, PieChart,
                                             ScatterChart, SuperChart)
    ex = full.run_code("import matplotlib.pyplot as plt\nplt.bar(['a', 'b', 'c'], [3, 1, 2], label='n')\n"
                       "plt.xlabel('Letter')\nplt.ylabel('Count [pcs]')\nplt.title('Bars')\nplt.show()")
    (res,) = ex.results
    bar = res.chart
    assert isinstance(bar, BarChart) and res.png and (bar.title, bar.x_label, bar.y_unit) == ("Bars", "Letter", "pcs")
    assert [(b.label, b.value, b.group) for b in bar.elements] == [("a", 3, "n"), ("b", 1, "n"), ("c", 2, "n")]
    line = full.run_code("""
        import datetime
        days = [datetime.date(2026, 1, d) for d in (1, 2, 3)]
        plt.plot(days, [1.5, 2.5, 2], label='temp')
        plt.ylabel('Temperature (C)')
        plt.show()
        """).results[0].chart
    assert isinstance(line, LineChart) and (line.x_scale, line.y_scale, line.y_unit) == ("datetime", "linear", "C")
    assert line.elements[0].label == "temp"
    assert line.elements[0].points == [("2026-01-01", 1.5), ("2026-01-02", 2.5), ("2026-01-03", 2)]
    assert all(isinstance(t, str) for t in line.x_ticks) and all(isinstance(t, float) for t in line.y_ticks)
    pie = full.run_code("plt.pie([90, 10], labels=['No', 'Yes'], startangle=90)\nplt.show()").results[0].chart
    assert isinstance(pie, PieChart) and [(w.label, w.angle, w.radius) for w in pie.elements] == [
        ("No", 324, 1), ("Yes", 36, 1)]
    box = full.run_code("fig, ax = plt.subplots()\n"
                        "ax.boxplot([[85, 90, 78, 92, 88], [95, 89, 76, 91, 84, 87]], labels=['A', 'B'],"
                        " patch_artist=True)\nplt.show()").results[0].chart
    assert isinstance(box, BoxAndWhiskerChart)
    assert [(b.label, b.min, b.first_quartile, b.median, b.third_quartile, b.max, b.outliers) for b in box.elements] == [
        ("A", 78, 85, 88, 90, 92, []), ("B", 84, 84.75, 88, 90.5, 95, [76])]
    sup = full.run_code("fig, (a, b) = plt.subplots(1, 2)\nfig.suptitle('Both')\na.plot([1, 2])\n"
                        "b.scatter([1, 2, 3], ['x', 'y', 'x'])\nplt.show()").results[0].chart
    assert isinstance(sup, SuperChart) and sup.title == "Both"
    first, second = sup.elements
    assert isinstance(first, LineChart) and first.elements[0].points == [(0, 1), (1, 2)]
    assert isinstance(second, ScatterChart) and second.y_scale == "categorical"
    # A figure with nothing plotted has no chart; one of other shapes is `unknown`.
    assert full.run_code("plt.figure()\nplt.show()").results[0].chart is None
    ex = full.run_code("fig, ax = plt.subplots()\nax.add_patch(plt.Circle((0, 0), 1))\nax.set_title('c')\nfig")
    assert (ex.results[0].chart.type, ex.results[0].chart.title) == (ChartType.UNKNOWN, "c")


def test_dataframes_and_images_as_e2b_shows_them(full):
    ex = full.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 't': pd.to_datetime(['2026-01-01', None])})")
    assert ex.results[0].data == {"a": [1, 2], "t": ["2026-01-01T00:00:00", None]}
    # PIL's show() and save() to a file display the image (E2B's interpreter does).
    ex = full.run_code("from PIL import Image\nim = Image.new('RGB', (4, 4))\nim.show()\nim.save('x.png')")
    assert ex.error is None and len(ex.results) == 2 and all(r.png for r in ex.results)


def test_ipython_display(full):
    ex = full.run_code("from IPython.display import display, HTML, Markdown\n"
                       "display(HTML('<b>bold</b>'))\nMarkdown('*m*')")
    assert ex.error is None, ex.error
    shown, main = ex.results
    assert shown.html == "<b>bold</b>" and not shown.is_main_result
    assert main.markdown == "*m*" and main.is_main_result


def test_a_kernel_that_cannot_start_is_a_400_with_its_reason(full):
    """TypeScript is offered here (the template has node-typescript), but
    with the compiler gone the kernel stops before it is ready: the run is
    refused 400 with what the kernel said, not a stream ending in an error,
    and not a hang."""
    from e2b import SandboxException
    full.commands.run("mv /usr/share/nodejs/typescript /usr/share/nodejs/typescript.gone", user="root")
    t0 = time.monotonic()
    with pytest.raises(SandboxException, match="400 Bad Request: .*interpreter exited while starting: "
                                               "no TypeScript compiler in this sandbox"):
        full.run_code("1", language="ts")
    assert time.monotonic() - t0 < 20
    # JavaScript runs on, and TypeScript once the compiler is back.
    assert full.run_code("1 + 1", language="js").text == "2"
    full.commands.run("mv /usr/share/nodejs/typescript.gone /usr/share/nodejs/typescript", user="root")
    assert full.run_code("const n: number = 3\nn", language="ts").text == "3"


def test_r_prints_as_r_does_and_its_last_value_is_the_result(full):
    # E2B's suite (test_r_kernel, test_cwd_r): R's own printing.
    ex = full.run_code('print("Hello, World!")', language="r")
    assert ex.logs.stdout == ['[1] "Hello, World!"\n'] and ex.error is None
    assert [r.text for r in full.run_code("getwd()", language="r").results] == ['[1] "/home/user"']
    # State is kept; only the last visible value is the result, earlier
    # ones print; an invisible last value is none.
    ex = full.run_code("x <- c(1, 2, 3)\nsum(x)\nmean(x) * 2", language="r")
    assert ex.logs.stdout == ["[1] 6\n"] and [r.text for r in ex.results] == ["[1] 4"]
    assert full.run_code("y <- x * 2", language="r").results == []
    assert full.run_code("y", language="r").text == "[1] 2 4 6"
    ex = full.run_code("message('to stderr'); cat('a', 'b\\n')", language="r")
    # R writes cat's pieces one by one: they stream as R writes them.
    assert ex.logs.stderr == ["to stderr\n"] and "".join(ex.logs.stdout) == "a b\n"


def test_r_envs_are_for_their_run_and_the_sandbox_s_stay(full_template):
    from e2b_code_interpreter import Sandbox
    s = Sandbox.create(full_template, envs={"TEST_ENV_VAR": "supertest"}, timeout=120)
    try:
        assert s.run_code("Sys.getenv('TEST_ENV_VAR')", language="r").text == '[1] "supertest"'
        assert s.run_code("Sys.getenv('TEST_ENV_VAR')", language="r",
                          envs={"TEST_ENV_VAR": "overwrite"}).text == '[1] "overwrite"'
        assert s.run_code("Sys.getenv('TEST_ENV_VAR')", language="r").text == '[1] "supertest"'
        assert s.run_code("Sys.getenv('FOO')", envs={"FOO": "bar"}, language="r").text == '[1] "bar"'
        assert s.run_code("Sys.getenv('FOO', unset = 'default')", language="r").text == '[1] "default"'
        # Children of R see them too.
        assert s.run_code("system('echo $FOO')", envs={"FOO": "child"}, language="r").logs.stdout == ["child\n"]
    finally:
        s.kill()


def test_r_errors_have_name_and_value(full):
    full.run_code("kept <- 1", language="r")
    ex = full.run_code('f <- function() stop("x")\nf()', language="r")
    assert (ex.error.name, ex.error.value) == ("simpleError", "x")
    assert ex.error.traceback.startswith("Error in f(): x")
    ex = full.run_code("stop('top')", language="r")
    assert (ex.error.value, ex.error.traceback) == ("top", "Error: top\n")
    # A long cell with a character JSON escapes as \u0001 (R's own parser
    # refuses such a string of over 10000 characters).
    assert full.run_code("s <- '%s\x01'; nchar(s)" % ("é" * 12000), language="r").text == "[1] 12001"
    ex = full.run_code("1 +* 2", language="r")
    assert ex.error.name == "SyntaxError" and "unexpected" in ex.error.value
    # A warning goes to stderr and is no error; the context lives on.
    ex = full.run_code("as.integer('a')\nkept", language="r")
    assert ex.error is None and ex.text == "[1] 1" and "NAs introduced by coercion" in "".join(ex.logs.stderr)


def test_java_runs_in_jshell_with_the_last_expression_as_result(full):
    # E2B's suite (test_java_kernel, test_cwd_java).
    ex = full.run_code('System.out.println("Hello, World!")', language="java")
    assert ex.logs.stdout[0] == "Hello, World!" and "".join(ex.logs.stdout) == "Hello, World!\n"
    assert ex.error is None and ex.results == []
    assert [r.text for r in full.run_code('System.getProperty("user.dir")', language="java").results] == ["/home/user"]
    # Declarations persist; the last expression is the result.
    assert full.run_code("int x = 40;\nint add(int a, int b) { return a + b; }", language="java").results == []
    assert full.run_code("add(x, 2)", language="java").text == "42"
    assert full.run_code("List.of(1, 2).stream().map(i -> i * 3).collect(Collectors.toList())",
                         language="java").text == "[3, 6]"
    ctx = full.create_code_context(language="java", cwd="/tmp")
    assert (ctx.language, ctx.cwd) == ("java", "/tmp")
    assert full.run_code('System.getProperty("user.dir")', context=ctx).text == "/tmp"
    assert full.run_code("x", context=ctx).error.name == "CompilationError"


def test_java_envs_are_system_properties_for_their_run(full_template):
    from e2b_code_interpreter import Sandbox
    s = Sandbox.create(full_template, envs={"TEST_ENV_VAR": "supertest"}, timeout=120)
    try:
        get = 'System.getProperty("TEST_ENV_VAR")'
        assert s.run_code(get, language="java").text == "supertest"
        assert s.run_code(get, language="java", envs={"TEST_ENV_VAR": "overwrite"}).text == "overwrite"
        assert s.run_code(get, language="java").text == "supertest"
        assert s.run_code('System.getProperty("FOO")', envs={"FOO": "bar"}, language="java").text == "bar"
        assert s.run_code('System.getProperty("FOO", "default")', language="java").text == "default"
    finally:
        s.kill()


def test_java_errors_have_name_and_value(full):
    full.run_code("int kept = 1;", language="java")
    ex = full.run_code('throw new IllegalStateException("boom")', language="java")
    assert (ex.error.name, ex.error.value) == ("java.lang.IllegalStateException", "boom")
    assert ex.error.traceback.startswith("java.lang.IllegalStateException: boom\n")
    ex = full.run_code("int z = ;", language="java")
    assert ex.error.name == "CompilationError" and ex.error.value
    ex = full.run_code('System.out.print("before ");\nInteger.parseInt("x")', language="java")
    assert ex.logs.stdout == ["before "] and ex.error.name == "java.lang.NumberFormatException"
    assert full.run_code("kept", language="java").text == "1"


@pytest.mark.parametrize("lang,keep,spin,check,fresh", [
    ("r", "kept <- 1", "repeat {}", "exists('kept')", "[1] FALSE"),
    ("java", "int kept = 1;", "while (true) {}", "Arrays.asList(1)", "[1]"),
])
def test_an_r_or_java_run_past_its_timeout_restarts_the_context(full, lang, keep, spin, check, fresh):
    full.run_code(keep, language=lang, timeout=60)
    with pytest.raises(TimeoutException):
        full.run_code(spin, language=lang, timeout=5)
    # Stopped (its unit killed), so this one does not wait behind it; the
    # context starts clean.
    assert full.run_code(check, language=lang, timeout=60).text == fresh
    if lang == "java":
        assert full.run_code("kept", language=lang, timeout=60).error.name == "CompilationError"
