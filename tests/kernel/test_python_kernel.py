"""Host-side tests of the run_code Python kernel (crates/hatchery-agent/src/kernel/python_kernel.py).

The kernel is started the way hatchery-agent starts it: `python3 -u -E -s -c
<source>`, fd 0 /dev/null, fd 1/2 raw output pipes, fd 3 the request pipe,
fd 4 the event pipe.
"""
import ast
import base64
import json
import os
import select
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

PYTHON = "/usr/bin/python3"
KERNEL = Path(__file__).resolve().parents[2] / "crates/hatchery-agent/src/kernel/python_kernel.py"
CHARTS = KERNEL.with_name("python_charts.py")
TIMEOUT = 10.0


def argv():
    """The kernel's command line, as hatchery-agent builds it (other kernels'
    tests replace this)."""
    return [PYTHON, "-u", "-E", "-s", "-c", KERNEL.read_text(), CHARTS.read_text()]


class Kernel:
    def __init__(self, cwd, env=None):
        req_r, self.req_w = os.pipe()
        self.ev_r, ev_w = os.pipe()
        self.out_r, out_w = os.pipe()
        self.err_r, err_w = os.pipe()
        # Eight fresh fds exist now, so fds 3 and 4 are certainly open here and
        # pass_fds may name them; the child moves the two pipe ends onto them.
        def place():
            r, w = os.dup(req_r), os.dup(ev_w)  # first off 3/4: either could be the other's target
            os.dup2(r, 3)
            os.dup2(w, 4)

        self.proc = subprocess.Popen(
            argv(),
            stdin=subprocess.DEVNULL, stdout=out_w, stderr=err_w, cwd=cwd,
            env=env if env is not None else dict(os.environ),
            pass_fds=(3, 4), preexec_fn=place,
        )
        for fd in (req_r, ev_w, out_w, err_w):
            os.close(fd)
        self.buf = b""
        self.raw = {self.out_r: b"", self.err_r: b""}
        self.next_id = 1
        self.ready = self.event()

    def event(self, timeout=TIMEOUT):
        """The next event line from fd 4, parsed."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            assert left > 0 and select.select([self.ev_r], [], [], left)[0], "no event in time"
            chunk = os.read(self.ev_r, 65536)
            assert chunk, "event pipe closed; kernel stderr: %r" % self.read_raw(self.err_r, 0.2)
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def pending(self, wait=0.0):
        return b"\n" in self.buf or bool(select.select([self.ev_r], [], [], wait)[0])

    def send(self, obj):
        os.write(self.req_w, (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n")

    def start(self, code, env=None):
        rid, self.next_id = self.next_id, self.next_id + 1
        self.send({"id": rid, "code": textwrap.dedent(code), "env": env or {}})
        return rid

    def collect(self, rid=None):
        """Events up to and including "done"; all must carry rid."""
        events = []
        while True:
            ev = self.event()
            assert ev.get("id") == rid, ev
            events.append(ev)
            if ev["type"] == "done":
                return events

    def run(self, code, env=None):
        return self.collect(self.start(code, env))

    def read_raw(self, fd, timeout=TIMEOUT, until=b""):
        """What has arrived on fd 1 or 2, waiting up to timeout for `until`."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if until and until in self.raw[fd] or left <= 0:
                return self.raw[fd]
            if select.select([fd], [], [], left)[0]:
                chunk = os.read(fd, 65536)
                if not chunk:
                    return self.raw[fd]
                self.raw[fd] += chunk

    def close(self):
        for fd in (self.req_w,):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self.ev_r, self.out_r, self.err_r):
            os.close(fd)


@pytest.fixture
def kernel(tmp_path):
    k = Kernel(tmp_path)
    yield k
    k.close()


def text(events, kind="stdout"):
    return "".join(e["text"] for e in events if e["type"] == kind)


def results(events):
    return [e for e in events if e["type"] == "result"]


def errors(events):
    return [e for e in events if e["type"] == "error"]


def value_of(events):
    """The text/plain of the main result among events."""
    (res,) = [r for r in results(events) if r["is_main_result"]]
    return res["data"]["text/plain"]


def value(kernel, expr):
    """The text/plain of a cell's main result."""
    (res,) = results(kernel.run(expr))
    assert res["is_main_result"] is True
    return res["data"]["text/plain"]


# --- startup, streams, results ---------------------------------------------------


def test_ready_event(kernel):
    version = subprocess.check_output([PYTHON, "-c", "import platform; print(platform.python_version())"])
    assert kernel.ready == {"type": "ready", "pid": kernel.proc.pid, "language": "python",
                            "version": version.decode().strip()}


def test_stdout_and_stderr_events(kernel):
    events = kernel.run("""\
        import sys
        print("hello", 42)
        sys.stdout.write("")
        print("oops", file=sys.stderr)
    """)
    assert text(events) == "hello 42\n"
    assert text(events, "stderr") == "oops\n"
    assert all(e["text"] for e in events if e["type"] in ("stdout", "stderr"))
    assert events[-1] == {"id": 1, "type": "done", "execution_count": 1}


def test_first_print_arrives_at_once(kernel):
    kernel.start("import time\nprint('first')\ntime.sleep(1.5)")
    first = kernel.event(timeout=1.0)
    # One message, text and end together, as Jupyter sends it (print writes them separately).
    assert first["type"] == "stdout" and first["text"] == "first\n"
    assert not kernel.pending(0.3)  # the cell is still sleeping: no done yet
    assert kernel.collect(1)[-1]["type"] == "done"


def test_output_is_line_buffered(kernel):
    kernel.start("""\
        import sys, time
        print("a", "b", 3)
        sys.stdout.write("no end")
        print("err", file=sys.stderr)
        sys.stdout.write("held ")
        sys.stdout.write("then flushed")
        sys.stdout.flush()
        sys.stdout.write("x" * 9000)
        sys.stdout.write("tail")
        time.sleep(1.5)
    """)
    got = [(e["type"], e["text"]) for e in (kernel.event(timeout=1.0) for _ in range(5))]
    # Text written without an end is held until the line ends, a flush, the
    # other stream, 8 KiB or the cell's end; the order of both streams is kept.
    assert got == [("stdout", "a b 3\n"), ("stdout", "no end"), ("stderr", "err\n"),
                   ("stdout", "held then flushed"), ("stdout", "x" * 9000)]
    assert not kernel.pending(0.3)  # "tail" is held while the cell sleeps
    events = kernel.collect(1)
    assert [(e["type"], e.get("text")) for e in events] == [("stdout", "tail"), ("done", None)]


def test_held_text_comes_before_a_result_or_an_error(kernel):
    events = kernel.run("print('a', end='')\ndisplay(1)\nprint('b', end='')\n1/0")
    assert [(e["type"], e.get("text")) for e in events] == [
        ("stdout", "a"), ("result", None), ("stdout", "b"), ("error", None), ("done", None)]


def test_shell_lines_as_ipython(kernel, tmp_path):
    events = kernel.run("!pwd\nn = 2\nout = !seq $n; echo {n + 1}\nprint(out)\n!exit 3")
    assert text(events) == "%s\n['1', '2', '3']\n" % tmp_path
    assert value(kernel, "_exit_code") == "3"
    # Indented in a block, stderr merged, $NAME that is no Python name left to the shell.
    events = kernel.run("for i in range(2):\n    !echo $i $NOSUCH_PY_NAME; echo e >&2")
    assert text(events) == "0\ne\n1\ne\n"
    # Python that contains a `!` is never rewritten; a cell broken elsewhere says where.
    assert value(kernel, "s = '''\n!pwd\n'''\ns") == "'\\n!pwd\\n'"
    (err,) = errors(kernel.run("!echo ok\n1 +"))
    assert err["name"] == "SyntaxError" and "1 +" in err["traceback"]


def test_chdir_moves_the_kernel_for_good(kernel, tmp_path):
    (tmp_path / "there").mkdir()
    (tmp_path / "there" / "mod_there.py").write_text("X = 'imported'\n")
    kernel.send({"id": 1, "code": "import os; print(os.getcwd())", "env": {}, "chdir": str(tmp_path / "there")})
    assert text(kernel.collect(1)) == str(tmp_path / "there") + "\n"
    kernel.next_id = 2
    assert value(kernel, "import mod_there; mod_there.X") == "'imported'"
    assert value(kernel, "os.getcwd()") == repr(str(tmp_path / "there"))
    kernel.send({"id": 4, "code": "1", "env": {}, "chdir": str(tmp_path / "missing")})
    events = kernel.collect(4)
    assert "cannot change the working directory" in text(events, "stderr") and results(events)


def test_last_expression_is_main_result(kernel):
    events = kernel.run("x = 20\nx + 22")
    (res,) = results(events)
    assert res == {"id": 1, "type": "result", "data": {"text/plain": "42"}, "is_main_result": True}
    assert [e["type"] for e in events] == ["result", "done"]


def test_none_and_statements_give_no_result(kernel):
    assert results(kernel.run("None")) == []
    assert results(kernel.run("print('p')")) == []
    assert results(kernel.run("y = 1")) == []
    assert results(kernel.run("")) == []


def test_underscore_holds_last_value(kernel):
    assert value(kernel, "6 * 7") == "42"
    assert value(kernel, "_ + 1") == "43"


def test_namespace_persists(kernel, tmp_path):
    (tmp_path / "helper_mod.py").write_text("GREETING = 'hi from cwd'\n")
    kernel.run("import collections\ncounter = collections.Counter('abca')\ndef twice(v):\n    return 2 * v")
    assert value(kernel, "counter['a'], twice(21)") == "(2, 42)"
    assert value(kernel, "__name__, '__builtins__' in globals()") == "('__main__', True)"
    assert value(kernel, "import helper_mod\nhelper_mod.GREETING") == "'hi from cwd'"
    # Cells live in a real __main__ module, so pickle round-trips their classes.
    assert value(kernel, "import pickle\nclass P: pass\ntype(pickle.loads(pickle.dumps(P()))) is P") == "True"


def test_execution_count_increments(kernel):
    counts = [kernel.run(code)[-1]["execution_count"] for code in ("1", "1/0", "x = (", "2")]
    assert counts == [1, 2, 3, 4]


# --- rich output -------------------------------------------------------------------

RICH = """\
class Rich:
    def __repr__(self):
        return "Rich()"
    def _repr_html_(self):
        return "<b>rich</b>"
    def _repr_png_(self):
        return b"\\x89PNG\\r\\n"
    def _repr_json_(self):
        return {"a": [1, 2]}

class Broken:
    def _repr_html_(self):
        raise RuntimeError("no html today")
    def _repr_markdown_(self):
        return None
    def _repr_svg_(self):
        return "<svg/>"
    def __repr__(self):
        return "Broken()"

class Bundle:
    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"text/html": "<i>b</i>", "application/vnd.custom+json": {"k": 1}}
"""


def test_display_rich_bundle(kernel):
    events = kernel.run(RICH + "display(Rich(), 5)\nprint('after')")
    first, second = results(events)
    assert first["is_main_result"] is False and second["is_main_result"] is False
    assert first["data"] == {"text/plain": "Rich()", "text/html": "<b>rich</b>",
                             "image/png": base64.b64encode(b"\x89PNG\r\n").decode(),
                             "application/json": {"a": [1, 2]}}
    assert second["data"] == {"text/plain": "5"}
    assert [e["type"] for e in events] == ["result", "result", "stdout", "done"]


def test_ipython_display_publishes_rich_results(kernel, tmp_path):
    # A stand-in for IPython's layout (IPython.display star-imports
    # IPython.core.display_functions, whose display() prints reprs outside
    # an IPython shell), in the kernel's directory, which is on sys.path.
    pkg = tmp_path / "IPython"
    (pkg / "core").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "core" / "__init__.py").write_text("")
    (pkg / "core" / "display_functions.py").write_text(
        "__all__ = ['display']\ndef display(*objs, **kw):\n    print(*objs)\n")
    (pkg / "display.py").write_text("from IPython.core.display_functions import *\n")
    events = kernel.run(RICH + "from IPython.display import display\ndisplay(Rich())")
    (res,) = results(events)
    assert res["is_main_result"] is False and res["data"]["text/html"] == "<b>rich</b>"
    assert text(events) == ""


def test_display_raw_publishes_the_bundle_as_given(kernel):
    # IPython's display(bundle, raw=True): the dict is the MIME bundle, with
    # no text/plain of its own (E2B's test_custom_repr_object expects
    # formats() == ["latex"]).
    events = kernel.run(r"display({'text/latex': r'\text{x}'}, {'text/plain': 'p', 'text/html': '<b/>'}, raw=True)")
    assert [r["data"] for r in results(events)] == [{"text/latex": r"\text{x}"},
                                                    {"text/plain": "p", "text/html": "<b/>"}]


def test_an_indented_cell_loses_its_indent(kernel):
    # IPython's leading-indent rule: E2B's tests send cells cut from indented
    # triple-quoted strings. Line numbers stay the cell's own.
    rid, kernel.next_id = kernel.next_id, kernel.next_id + 1
    kernel.send({"id": rid, "env": {},
                 "code": "\n    def f():\n        return 41\n\n  # less\n    f() + 1\n"})
    events = kernel.collect(rid)
    assert errors(events) == [] and value_of(events) == "42"
    rid, kernel.next_id = kernel.next_id, kernel.next_id + 1
    kernel.send({"id": rid, "env": {}, "code": "\n\n    x = 1\n    1/0\n"})
    (err,) = errors(kernel.collect(rid))
    assert err["name"] == "ZeroDivisionError" and 'line 4' in err["traceback"], err
    # The first line of code counts, not a comment; valid code never changes.
    for code, want in (("\n    # a comment\n    y = 2\n    y\n", "2"),
                       ("  # a comment\ns = '''\n  kept'''\ns", repr("\n  kept"))):
        rid, kernel.next_id = kernel.next_id, kernel.next_id + 1
        kernel.send({"id": rid, "env": {}, "code": code})
        assert value_of(kernel.collect(rid)) == want, code


def test_dataframe_results_carry_their_columns(kernel, tmp_path):
    # A stand-in for pandas (not on the host): E2B's `e2b/data` is a
    # DataFrame's to_dict(orient="list"), JSON-safe.
    (tmp_path / "pandas.py").write_text(
        "import datetime\nclass DataFrame:\n"
        "    def to_dict(self, orient):\n"
        "        assert orient == 'list'\n"
        "        return {'a': [1, 2.5, float('nan'), None], 'when': [datetime.date(2026, 1, 2)] * 3 + ['NaT']}\n"
        "    def __repr__(self):\n        return 'frame'\n"
        "def isna(v):\n    return v == 'NaT'\n")
    events = kernel.run("import pandas\npandas.DataFrame()")
    (res,) = results(events)
    assert res["data"] == {"text/plain": "frame",
                           "e2b/data": {"a": [1, 2.5, None, None], "when": ["2026-01-02"] * 3 + [None]}}
    assert "e2b/data" not in results(kernel.run("{'a': [1]}"))[0]["data"]


def test_pil_show_and_save_display_the_image(kernel, tmp_path):
    # A stand-in for Pillow (PIL.Image.Image with a PNG repr): show() and
    # save() to a path display the image, as in E2B's interpreter.
    (tmp_path / "PIL").mkdir()
    (tmp_path / "PIL" / "__init__.py").write_text("")
    (tmp_path / "PIL" / "Image.py").write_text(
        "class Image:\n"
        "    def _repr_png_(self):\n        return b'PNG'\n"
        "    def show(self):\n        raise RuntimeError('no viewer')\n"
        "    def save(self, fp, format=None):\n"
        "        (open(fp, 'wb') if isinstance(fp, str) else fp).write(b'PNG')\n")
    events = kernel.run("import io\nfrom PIL import Image\nim = Image.Image()\nim.show()\n"
                        "im.save('x.png')\nim.save(io.BytesIO())\nprint('done')")
    assert errors(events) == []
    assert [r["data"]["image/png"] for r in results(events)] == [base64.b64encode(b"PNG").decode()] * 2
    assert (tmp_path / "x.png").read_bytes() == b"PNG"


def test_broken_repr_method_is_skipped(kernel):
    events = kernel.run(RICH + "Broken()")
    assert errors(events) == []
    (res,) = results(events)
    assert res["is_main_result"] is True
    assert res["data"] == {"text/plain": "Broken()", "image/svg+xml": "<svg/>"}


def test_mimebundle(kernel):
    (res,) = results(kernel.run(RICH + "Bundle()"))
    assert res["data"]["text/html"] == "<i>b</i>"
    assert res["data"]["application/vnd.custom+json"] == {"k": 1}
    assert res["data"]["text/plain"].startswith("<__main__.Bundle object")


def test_result_of_a_class_is_plain(kernel):
    (res,) = results(kernel.run(RICH + "Rich"))
    assert res["data"] == {"text/plain": "<class '__main__.Rich'>"}


# --- errors --------------------------------------------------------------------------


def test_exception_traceback_shows_user_frames_only(kernel):
    kernel.run("def f(x):\n    return 1 / x\n")
    events = kernel.run("y = 2\nf(0)\n")
    (err,) = errors(events)
    assert err["name"] == "ZeroDivisionError" and err["value"] == "division by zero"
    tb = err["traceback"]
    assert tb.startswith("Traceback (most recent call last):")
    assert 'File "<cell-2>", line 2, in <module>' in tb and "f(0)" in tb
    assert 'File "<cell-1>", line 2, in f' in tb and "return 1 / x" in tb
    assert "<string>" not in tb and "_run_cell" not in tb and "python_kernel" not in tb
    assert tb.rstrip().endswith("ZeroDivisionError: division by zero")
    assert events[-1]["type"] == "done"
    assert value(kernel, "y") == "2"  # the statement before the error ran


def test_syntax_error(kernel):
    (err,) = errors(kernel.run("x = (1,\n"))
    assert err["name"] == "SyntaxError"
    assert '"<cell-1>", line 1' in err["traceback"] and "x = (1," in err["traceback"]
    assert "_run_cell" not in err["traceback"]
    assert value(kernel, "1 + 1") == "2"


def test_sys_exit_is_an_error_and_kernel_survives(kernel):
    events = kernel.run("import sys\nsys.exit(3)")
    (err,) = errors(events)
    assert (err["name"], err["value"]) == ("SystemExit", "3")
    assert events[-1]["type"] == "done"
    (err,) = errors(kernel.run("raise KeyboardInterrupt"))
    assert err["name"] == "KeyboardInterrupt"
    assert value(kernel, "'alive'") == "'alive'"
    assert kernel.proc.poll() is None


def test_sigint_interrupts_a_running_cell(kernel):
    kernel.start("import time\nprint('go')\ntime.sleep(30)")
    assert text([kernel.event()]) == "go\n"
    time.sleep(0.2)  # into time.sleep (an interrupt inside print is fine too, just another line)
    kernel.proc.send_signal(signal.SIGINT)
    events = kernel.collect(1)
    (err,) = errors(events)
    assert err["name"] == "KeyboardInterrupt"
    assert 'File "<cell-1>", line 3' in err["traceback"] and "<string>" not in err["traceback"]
    kernel.proc.send_signal(signal.SIGINT)  # while idle: ignored
    time.sleep(0.2)
    assert value(kernel, "'alive'") == "'alive'"


def test_malformed_requests(kernel):
    kernel.send(b"this is not json")
    err, done = kernel.event(), kernel.event()
    assert (err["id"], err["type"], err["name"]) == (None, "error", "KernelError")
    assert (done["id"], done["type"]) == (None, "done")
    kernel.send({"id": 7, "env": {}})  # no code
    err, done = kernel.event(), kernel.event()
    assert (err["id"], err["name"], done["id"], done["type"]) == (7, "KernelError", 7, "done")
    kernel.send({"id": 8, "code": "1", "env": {"A": 1}})  # env values must be strings
    assert kernel.event()["name"] == "KernelError" and kernel.event()["type"] == "done"
    kernel.next_id = 9
    assert value(kernel, "'still serving'") == "'still serving'"


# --- environment and raw fds -----------------------------------------------------------


def test_env_applied_and_restored(tmp_path):
    k = Kernel(tmp_path, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "KEEP": "orig"})
    try:
        code = "import os, subprocess\nsubprocess.run(['sh', '-c', 'echo child=$ADDED'])\n" \
               "os.environ.get('KEEP'), os.environ.get('ADDED')"
        (res,) = results(k.run(code, env={"KEEP": "new", "ADDED": "1"}))
        assert res["data"]["text/plain"] == "('new', '1')"
        assert b"child=1\n" in k.read_raw(k.out_r, until=b"child=1\n")
        assert value(k, "os.environ.get('KEEP'), 'ADDED' in os.environ") == "('orig', False)"
    finally:
        k.close()


def test_raw_fd_writes_bypass_events(kernel):
    events = kernel.run("import os, subprocess\nos.write(1, b'raw-fd1')\nos.write(2, b'raw-fd2')\n"
                        "subprocess.run(['echo', 'hi'])\nNone")
    assert [e["type"] for e in events] == ["done"]
    assert kernel.read_raw(kernel.out_r, until=b"raw-fd1hi\n") == b"raw-fd1hi\n"
    assert kernel.read_raw(kernel.err_r, until=b"raw-fd2") == b"raw-fd2"


def test_request_and_event_fds_not_inherited(kernel):
    assert value(kernel, "import os\nos.get_inheritable(3), os.get_inheritable(4)") == "(False, False)"
    code = "import subprocess\nsubprocess.run(['sh', '-c', 'ls /proc/$$/fd'], capture_output=True).stdout.decode().split()"
    fds = ast.literal_eval(value(kernel, code))
    assert "3" not in fds and "4" not in fds


# --- asyncio ----------------------------------------------------------------------------


def test_top_level_await(kernel):
    assert value(kernel, "import asyncio\nawait asyncio.sleep(0.01)\nawait asyncio.sleep(0, result=42)") == "42"
    kernel.run("async def loop_of():\n    return asyncio.get_running_loop()\nfirst = await loop_of()")
    assert value(kernel, "(await loop_of()) is first") == "True"  # one loop for all cells
    (err,) = errors(kernel.run("await asyncio.sleep(0)\n1 / 0"))
    assert err["name"] == "ZeroDivisionError"
    assert "asyncio" not in err["traceback"] and 'File "<cell-4>", line 2' in err["traceback"]
    assert value(kernel, "asyncio.run(asyncio.sleep(0, result='sync run'))") == "'sync run'"


def test_interrupted_await_does_not_resume(kernel):
    kernel.start("import asyncio\nprint('go')\nawait asyncio.sleep(30)\nprint('resumed')")
    assert text([kernel.event()]) == "go\n"
    time.sleep(0.2)  # into the event loop's select
    kernel.proc.send_signal(signal.SIGINT)
    (err,) = errors(kernel.collect(1))
    assert err["name"] == "KeyboardInterrupt"
    assert "<string>" not in err["traceback"] and "asyncio" not in err["traceback"]
    events = kernel.run("await asyncio.sleep(0.05)\n'ok'")
    assert text(events) == "" and results(events)[0]["data"]["text/plain"] == "'ok'"


# --- matplotlib (a fake one: matplotlib is not installed on the host) -----------------------

FAKE_PYPLOT = '''\
import os
BACKEND = os.environ.get("MPLBACKEND")
_figs = {}

class Figure:
    def __init__(self, number):
        self.number, self.axes = number, []
    def savefig(self, fp, format=None):
        assert format == "png"
        if self.axes == ["boom"]:
            raise ValueError("cannot draw this")
        fp.write(b"PNG-%d-%d" % (self.number, len(self.axes)))
    def __repr__(self):
        return "<Figure size 640x480 with %d Axes>" % len(self.axes)

def figure(num=None):
    if num not in _figs:
        num = num or max(_figs, default=0) + 1
        _figs[num] = Figure(num)
    figure.current = _figs[num]
    return _figs[num]

def gcf():
    return figure.current if figure.current.number in _figs else figure()
figure.current = Figure(0)

def plot(*args):
    gcf().axes = ["ax"]

def get_fignums():
    return sorted(_figs)

def close(which=None):
    if which == "all":
        _figs.clear()
    else:
        _figs.pop(getattr(which, "number", which), None)

def show():
    print("the real show ran")
'''


@pytest.fixture
def fake_mpl(tmp_path):
    root = tmp_path / "fake-mpl"
    (root / "matplotlib").mkdir(parents=True)
    (root / "matplotlib" / "__init__.py").write_text("")
    (root / "matplotlib" / "pyplot.py").write_text(FAKE_PYPLOT)
    return "import sys\nsys.path.insert(0, %r)\nimport matplotlib.pyplot as plt\n" % str(root)


def png(res):
    return base64.b64decode(res["data"]["image/png"])


def test_figures_flushed_after_cell(kernel, fake_mpl):
    events = kernel.run(fake_mpl + "plt.figure()\nplt.plot([1, 2])\nplt.figure()\nplt.BACKEND")
    main, fig1, fig2 = results(events)
    assert main["data"]["text/plain"] == "'Agg'" and main["is_main_result"]
    assert fig1["data"] == {"image/png": base64.b64encode(b"PNG-1-1").decode(),
                            "text/plain": "<Figure size 640x480 with 1 Axes>"}
    assert not fig1["is_main_result"] and png(fig2) == b"PNG-2-0"
    assert results(kernel.run("plt.get_fignums()")) [0]["data"]["text/plain"] == "[]"  # closed


def test_plt_show_renders_at_once(kernel, fake_mpl):
    events = kernel.run(fake_mpl + "plt.plot([1])\nplt.show()\nprint('after show')\nplt.get_fignums()")
    kinds = [e["type"] for e in events]
    assert kinds == ["result", "stdout", "result", "done"]
    assert png(events[0]) == b"PNG-1-1" and not events[0]["is_main_result"]
    assert text(events) == "after show\n"  # not the fake's own show
    assert events[2]["data"]["text/plain"] == "[]" and events[2]["is_main_result"]


def test_figure_as_last_expression_shown_once(kernel, fake_mpl):
    events = kernel.run(fake_mpl + "fig = plt.figure()\nplt.plot([3])\nfig")
    (res,) = results(events)
    assert res["is_main_result"] is True and png(res) == b"PNG-1-1"
    assert res["data"]["text/plain"] == "<Figure size 640x480 with 1 Axes>"


def test_figure_that_fails_to_render(kernel, fake_mpl):
    events = kernel.run(fake_mpl + "plt.figure().axes = ['boom']\nprint('drawn later')")
    assert [e["type"] for e in events] == ["stdout", "error", "done"]
    err = events[1]
    assert (err["name"], err["value"]) == ("ValueError", "cannot draw this")
    assert "pyplot.py" in err["traceback"] and "<string>" not in err["traceback"]
    assert value(kernel, "plt.get_fignums()") == "[]"  # closed all the same


# --- shutdown ---------------------------------------------------------------------------------


def test_eof_on_requests_exits_zero(kernel):
    assert value(kernel, "1") == "1"
    os.close(kernel.req_w)
    assert kernel.proc.wait(timeout=5) == 0
    assert os.read(kernel.ev_r, 1) == b""  # nothing after the last done
