"""Hatchery's in-sandbox Python kernel, the engine behind run_code.

The agent starts it as `python3 -u -E -s -c <this source>` in the context's
working directory. fd 0 is /dev/null; fd 1 and fd 2 are pipes the agent
forwards as they are (child processes, C-level writes); fd 3 carries requests,
one JSON object a line ({"id", "code", "env", "chdir"}); fd 4 carries events,
one JSON object a line (ready, stdout, stderr, result, error, done). Standard
library only, no threads.
"""
import ast
import base64
import builtins
import io
import json
import linecache
import os
import platform
import re
import signal
import subprocess
import sys
import threading
import traceback

os.environ["MPLBACKEND"] = "Agg"  # before any user import: no display in a sandbox
os.set_inheritable(3, False)  # children must never hold the kernel's pipes
os.set_inheritable(4, False)
# The chart extractor's source (python_charts.py), the kernel's one argument,
# loaded on the first figure shown (_chart); user code sees no arguments.
_CHARTS_SOURCE = sys.argv[1] if len(sys.argv) > 1 else ""
del sys.argv[1:]

_FLAGS = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
_CO_COROUTINE = 0x80  # inspect.CO_COROUTINE (set when a cell awaits), without importing inspect
_KERNEL_FILE = sys._getframe().f_code.co_filename  # "<string>" under -c
_MIMES = (
    ("text/html", "_repr_html_"), ("text/markdown", "_repr_markdown_"),
    ("image/svg+xml", "_repr_svg_"), ("image/png", "_repr_png_"),
    ("image/jpeg", "_repr_jpeg_"), ("application/json", "_repr_json_"),
    ("text/latex", "_repr_latex_"), ("application/javascript", "_repr_javascript_"),
)
_lock = threading.RLock()  # user threads may print too; re-entrant for signal handlers
_current_id = None  # the request that output is attributed to
_count = 0  # execution_count
_loop = None  # one asyncio loop for all cells, made on the first top-level await
_ns = None  # the user's namespace, see main()
_charts = None  # python_charts.py's namespace once loaded


def _emit(event):
    """Write one event line to fd 4. SIGINT is held off during the write so an
    interrupt never leaves half a line on the pipe."""
    # ensure_ascii=False + "replace": a lone surrogate becomes "?" rather than
    # a \udXXX escape that strict JSON parsers reject.
    data = memoryview((json.dumps(event, ensure_ascii=False) + "\n").encode("utf-8", "replace"))
    with _lock:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            while data:
                data = data[os.write(4, data):]
        except BrokenPipeError:
            os._exit(1)  # the agent is gone: nobody is left to serve
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


# A stream's text is held until it ends a line, is flushed, or reaches this size.
_LINE_MAX = 8192


class _Stream(io.TextIOBase):
    """sys.stdout / sys.stderr, line-buffered: print() writes its text and its
    end separately, and Jupyter (so E2B's SDKs, which count messages) sends
    them as one message. A write that ends a line, flush() (print(...,
    flush=True)), another event or the cell's end sends what is held, so a
    printed line still reaches the host at once."""

    encoding = "utf-8"
    errors = "strict"

    def __init__(self, kind, fd):
        self.kind, self._fd, self.name = kind, fd, "<%s>" % kind
        self._held, self._size = [], 0

    def writable(self):
        return True

    def isatty(self):
        return False

    def fileno(self):
        return self._fd  # e.g. subprocess.run(stdout=sys.stdout) writes to fd 1/2

    def write(self, s):
        if not isinstance(s, str):
            raise TypeError("write() argument must be str, not " + type(s).__name__)
        if s:
            with _lock:
                for other in _streams:
                    if other is not self:
                        other.flush()  # stdout and stderr stay in the order written
                self._held.append(s)
                self._size += len(s)
                if s.endswith("\n") or self._size >= _LINE_MAX:
                    self.flush()
        return len(s)

    def flush(self):
        with _lock:
            if self._held:
                text, self._held, self._size = "".join(self._held), [], 0
                _emit({"id": _current_id, "type": self.kind, "text": text})

    def drop(self):
        with _lock:
            self._held, self._size = [], 0


_streams = ()  # (stdout, stderr) once main() has made them


def _flush_streams():
    for stream in _streams:
        stream.flush()


def _safe(fn, *args, **kwargs):
    """fn(*args), or None if it raises: a broken repr must not kill the execution."""
    try:
        return fn(*args, **kwargs)
    except Exception:
        return None


def _repr_call(obj, name, **kwargs):
    meth = None if isinstance(obj, type) else _safe(getattr, obj, name, None)  # a class's are unbound
    return _safe(meth, **kwargs) if callable(meth) else None


def _mime_value(mime, value):
    """Normalise one _repr_*_ return value for the wire, or None to skip it."""
    if isinstance(value, tuple) and len(value) == 2:
        value = value[0]  # IPython allows (data, metadata)
    if value is None:
        return None
    if mime == "application/json" or mime.endswith("+json"):
        try:
            value = json.loads(value) if isinstance(value, (str, bytes)) else value
            json.dumps(value, allow_nan=False)  # must survive the event encoding
            return value
        except (TypeError, ValueError):
            return None
    if isinstance(value, (bytes, bytearray)):
        if mime.startswith("image/") and mime != "image/svg+xml":
            return base64.b64encode(value).decode("ascii")
        return bytes(value).decode("utf-8", "replace")
    return value if isinstance(value, str) else _safe(str, value)


def _is_figure(obj):
    return type(obj).__module__.startswith("matplotlib") and _safe(hasattr, obj, "savefig")


def _figure_bundle(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    data = {"image/png": base64.b64encode(buf.getvalue()).decode("ascii"), "text/plain": _plain(fig)}
    chart = _chart(fig)  # after savefig: tick labels exist once the figure is drawn
    if chart:
        data["e2b/chart"] = chart
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:
        _safe(plt.close, fig)  # shown now, so the end-of-cell flush does not show it again
    return data


def _chart(fig):
    """The figure's chart data (E2B's `e2b/chart`, python_charts.py), or
    None: a figure it cannot read still shows as a PNG."""
    global _charts
    try:
        if _charts is None:
            _charts = {"__name__": "hatchery_charts"}
            exec(compile(_CHARTS_SOURCE, "<hatchery-charts>", "exec", dont_inherit=True), _charts)
        value = _charts["chart"](fig)
        json.dumps(value, allow_nan=False)  # must survive the event encoding
        return value
    except Exception:
        return None


def _frame_data(obj):
    """A pandas DataFrame's columns as lists (E2B's `e2b/data`, the SDKs'
    `Result.data`): timestamps as ISO strings, NaN and other values JSON
    lacks as null."""
    pandas = sys.modules.get("pandas")
    if pandas is None or not isinstance(obj, pandas.DataFrame):
        return None
    isna = getattr(pandas, "isna", None)

    def cell(v):
        if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
            return None
        if isna is not None and _safe(isna, v) is True:  # NaT, pandas.NA
            return None
        if isinstance(v, (str, int, float, bool)) or v is None:
            return v
        iso = getattr(v, "isoformat", None)
        return _safe(iso) if callable(iso) else _safe(str, v)

    try:
        return {str(k): [cell(v) for v in col] for k, col in obj.to_dict(orient="list").items()}
    except Exception:
        return None


def _plain(obj):
    text = _safe(repr, obj)
    return text if isinstance(text, str) else object.__repr__(obj)


def _bundle(obj):
    """A Jupyter-style MIME bundle for obj; text/plain is always there."""
    if _is_figure(obj):
        return _figure_bundle(obj)
    found = _repr_call(obj, "_repr_mimebundle_", include=None, exclude=None)
    if isinstance(found, tuple):
        found = found[0] if found else None  # (data, metadata)
    data = dict(found) if isinstance(found, dict) else {}
    for mime, meth in _MIMES:
        if mime not in data:
            data[mime] = _repr_call(obj, meth)
    data = {mime: _mime_value(mime, v) for mime, v in data.items() if isinstance(mime, str)}
    data = {mime: v for mime, v in data.items() if v is not None}
    frame = _frame_data(obj)
    if frame is not None:
        data["e2b/data"] = frame
    data["text/plain"] = _plain(obj)
    return data


def _result(obj, main):
    _flush_streams()
    _emit({"id": _current_id, "type": "result", "data": _bundle(obj), "is_main_result": main})


def display(*objs, raw=False, **_options):
    """Show each object as a rich result (a minimal Jupyter display()).
    With raw=True each object is a MIME bundle ({mime: data}) shown as it
    is, without a text/plain of its own, as IPython publishes it."""
    for obj in objs:
        if raw and isinstance(obj, dict):
            data = {mime: _mime_value(mime, v) for mime, v in obj.items() if isinstance(mime, str)}
            _flush_streams()
            _emit({"id": _current_id, "type": "result", "is_main_result": False,
                   "data": {mime: v for mime, v in data.items() if v is not None}})
        else:
            _result(obj, False)


def _flush_figures():
    """Show every open pyplot figure as a PNG result, then close them all."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    _patch_show(plt)
    try:
        for num in plt.get_fignums():
            _emit({"id": _current_id, "type": "result", "data": _figure_bundle(plt.figure(num)),
                   "is_main_result": False})
    finally:
        plt.close("all")


def _patch_show(plt):
    if not getattr(getattr(plt, "show", None), "_hatchery", False):
        def show(*args, **kwargs):
            """Show the open figures now (Hatchery's replacement for pyplot.show)."""
            _flush_figures()
        show._hatchery = True
        plt.show = show


def _patch_ipython_display(module):
    """IPython's display() outside an IPython shell prints each object's
    repr; the kernel's publishes it as a rich result, as Jupyter does."""
    module.display = display


def _patch_pil(module):
    """PIL's Image.show() opens a viewer, and in IPython it displays the
    image: here it is a PNG result. Image.save() to a path shows the image
    too, as E2B's code interpreter does (its 0003_images startup script)."""
    cls = getattr(module, "Image", None)
    if cls is None or getattr(cls.save, "_hatchery", False):
        return
    save = cls.save

    def show(self, *args, **kwargs):
        display(self)

    def saving(self, fp, *args, **kwargs):
        if isinstance(fp, (str, os.PathLike)):
            display(self)
        return save(self, fp, *args, **kwargs)
    saving._hatchery = True
    cls.show, cls.save = show, saving


# Modules patched right after their import, so the patch holds even in the
# cell that imports them. IPython.display star-imports IPython.core.display,
# which takes display from display_functions (IPython 8; before, it defined
# it), so `from IPython.display import display` gets the patched one.
_PATCHES = {
    "matplotlib.pyplot": _patch_show,
    "IPython.core.display_functions": _patch_ipython_display,
    "IPython.core.display": _patch_ipython_display,
    "PIL.Image": _patch_pil,
}


class _ImportHook:
    """Meta path finder: applies _PATCHES right after such a module is
    imported (e.g. pyplot.show, so plt.show() works even in the cell that
    imports pyplot)."""

    def find_spec(self, name, path, target=None):
        patch = _PATCHES.get(name)
        if patch is None:
            return None
        for finder in sys.meta_path:
            find_spec = None if finder is self else getattr(finder, "find_spec", None)
            spec = find_spec(name, path, target) if find_spec else None
            if spec is not None:
                if hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader, patch)
                return spec
        return None


class _PatchingLoader:
    def __init__(self, inner, patch):
        self._inner, self._patch = inner, patch

    def __getattr__(self, name):
        return getattr(self._inner, name)  # get_source, get_resource_reader, ...

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        self._patch(module)


def _run(code):
    """Evaluate one compiled piece of a cell; a top-level-await piece runs on the kernel's loop."""
    global _loop
    value = eval(code, _ns)
    if not code.co_flags & _CO_COROUTINE:
        return value
    import asyncio  # lazily: most cells never await, and the import costs startup time

    if _loop is None:
        _loop = asyncio.new_event_loop()
    asyncio.set_event_loop(_loop)  # user code may have unset it (asyncio.run does)
    task = _loop.create_task(value)
    try:
        return _loop.run_until_complete(task)
    except BaseException:
        # Interrupted from outside the task (e.g. SIGINT in select): cancel it so it
        # does not resume inside a later cell. (A task that died of KeyboardInterrupt
        # is done, and running a done one again would never stop the loop.)
        if not task.done():
            task.cancel()
            try:
                _loop.run_until_complete(task)
            except BaseException:
                pass
        raise


_SHELL_LINE = re.compile(r"^([ \t]*)(?:([A-Za-z_][\w.]*)[ \t]*=[ \t]*)?!(.*)$")
_EXPAND = re.compile(r"\$\$|\$([A-Za-z_]\w*)|\{([^{}]+)\}")


def _expand(command):
    """IPython's expansion of a shell line: {expr} and $name from the user's
    namespace; $$ is a $, and a $NAME that is no Python name is the shell's."""
    def one(m):
        if m.group(0) == "$$":
            return "$"
        try:
            if m.group(1) is not None:
                return str(_ns[m.group(1)]) if m.group(1) in _ns else m.group(0)
            return str(eval(m.group(2), _ns))
        except Exception:
            return m.group(0)
    return _EXPAND.sub(one, command)


def _shell(command, capture=False):
    """An IPython `!command` (or `x = !command`, which returns its lines):
    /bin/sh -c in the kernel's directory and environment, stderr merged into
    stdout, printed as it comes; the status in `_exit_code`."""
    sys.stdout.flush()
    proc = subprocess.Popen(_expand(command), shell=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines = []
    try:
        for raw in iter(proc.stdout.readline, b""):
            text = raw.decode("utf-8", "replace")
            if capture:
                lines.append(text.rstrip("\n"))
            else:
                sys.stdout.write(text)
    finally:
        proc.stdout.close()
        _ns["_exit_code"] = proc.wait()
    return lines if capture else None


def _shell_escapes(code):
    """The cell with IPython's `!` lines made calls of _shell, or None if it has none.
    Only tried on a cell that is not Python already, so a `!` in a string or
    an expression is never touched."""
    out, found = [], False
    for line in code.split("\n"):
        m = _SHELL_LINE.match(line)
        if m is None or not m.group(3).strip():
            out.append(line)
            continue
        found = True
        indent, target, command = m.groups()
        call = "__hatchery_shell__(%r, %s)" % (command, target is not None)
        out.append(indent + (target + " = " if target else "") + call)
    return "\n".join(out) if found else None


def _parse(code, filename):
    try:
        return compile(code, filename, "exec", ast.PyCF_ONLY_AST | _FLAGS, dont_inherit=True)
    except SyntaxError:
        shell = _shell_escapes(code)
        if shell is None:
            raise
    # Line for line the same cell: an error left is the cell's own, at its place.
    return compile(shell, filename, "exec", ast.PyCF_ONLY_AST | _FLAGS, dont_inherit=True)


def _dedent(code):
    """IPython's leading-indent rule: a cell whose first line of code is
    indented (say, a snippet cut from inside a function, or a triple-quoted
    string in a test) loses that indent on every line that has it. Such a
    cell is an IndentationError otherwise, so valid code never changes (the
    first line of code, not a comment: unlike IPython, which goes by the
    first line, an indented comment above unindented code changes nothing);
    blank lines stay, so line numbers in tracebacks are the cell's own."""
    first = next((line for line in code.split("\n") if line.strip() and not line.lstrip().startswith("#")), "")
    indent = first[:len(first) - len(first.lstrip(" \t"))]
    if not indent:
        return code
    return "\n".join(line[len(indent):] if line.startswith(indent) else line
                     for line in code.split("\n"))


def _run_cell(code, filename):
    """Exec a cell in the user namespace; a final expression's value is the main result."""
    code = _dedent(code)
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)  # lines in tracebacks
    tree = _parse(code, filename)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    _run(compile(tree, filename, "exec", _FLAGS, dont_inherit=True))
    if last is not None:
        value = _run(compile(ast.Expression(last.value), filename, "eval", _FLAGS, dont_inherit=True))
        if value is not None:
            builtins._ = value
            _result(value, True)


def _user_traceback(exc):
    """exc's traceback without the kernel's frames, without the event loop's in
    front of the user's, and, for an interrupt that landed in the kernel's own
    plumbing (e.g. inside print), without what the kernel had called."""
    kept, in_kernel, tb = [], False, exc.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        module = str(tb.tb_frame.f_globals.get("__name__")).split(".")[0]
        if filename == _KERNEL_FILE:
            in_kernel = True
        elif filename.startswith("<cell-"):
            in_kernel = False
            kept.append(tb)
        elif not (in_kernel and isinstance(exc, KeyboardInterrupt)) and (
                kept or module not in ("asyncio", "selectors")):
            kept.append(tb)
        tb = tb.tb_next
    tb = None
    for t in reversed(kept):
        tb = type(t)(tb, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return tb


def _error(exc):
    tb = _user_traceback(exc)
    sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, tb  # for pdb.pm()
    value = _safe(str, exc.code if isinstance(exc, SystemExit) else exc)
    _flush_streams()
    _emit({"id": _current_id, "type": "error", "name": type(exc).__name__,
           "value": value if isinstance(value, str) else "<unprintable>",
           "traceback": "".join(traceback.format_exception(type(exc), exc, tb))})


def _kernel_error(message):
    _flush_streams()
    _emit({"id": _current_id, "type": "error", "name": "KernelError", "value": message,
           "traceback": "KernelError: %s\n" % message})


def _handle(line):
    """Serve one request line; the caller emits its "done"."""
    global _current_id, _count
    _current_id = None
    try:
        req = json.loads(line)
        if not isinstance(req, dict):
            raise ValueError("a request must be a JSON object")
        rid, code, env = req.get("id"), req.get("code"), req.get("env") or {}
        chdir = req.get("chdir")
        if not isinstance(rid, int) or isinstance(rid, bool):
            raise ValueError("'id' must be an integer")
        _current_id = rid
        if not isinstance(code, str):
            raise ValueError("'code' must be a string")
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise ValueError("'env' must map strings to strings")
        if chdir is not None and not isinstance(chdir, str):
            raise ValueError("'chdir' must be a string")
    except Exception as exc:  # bad JSON, bad UTF-8, absurd nesting, wrong shape
        return _kernel_error("malformed request: %s" % exc)
    for stream in _streams:
        stream.drop()  # what threads printed between runs belongs to no run
    if chdir:
        _move(chdir)
    saved = {k: os.environ.get(k) for k in env}
    try:
        try:
            os.environ.update(env)
        except ValueError as exc:  # "=" in a name, a NUL byte
            return _kernel_error("bad env: %s" % exc)
        _count += 1
        try:
            _run_cell(code, "<cell-%d>" % _count)
        except BaseException as exc:  # SystemExit and KeyboardInterrupt too: the kernel lives on
            _error(exc)
        try:
            _flush_figures()
        except BaseException as exc:
            _error(exc)
    finally:
        for k, v in saved.items():  # the env was for this execution only
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _move(path):
    """Changes the kernel's directory for good (the agent placed the context
    there), and the module search path's entry for it with it."""
    old = os.getcwd()
    try:
        os.chdir(path)
    except OSError as exc:
        sys.stderr.write("cannot change the working directory to %s: %s\n" % (path, exc.strerror))
        return
    if sys.path and sys.path[0] == old:
        sys.path[0] = os.getcwd()


def main():
    global _ns
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if SIGINT came in ignored
    # A fresh __main__ module for user code, so pickle finds classes defined in cells.
    user_main = type(sys)("__main__")
    user_main.__builtins__ = builtins
    sys.modules["__main__"], _ns = user_main, user_main.__dict__
    sys.path.insert(0, os.getcwd())  # user modules in the working directory import
    sys.meta_path.insert(0, _ImportHook())
    global _streams
    builtins.display = display
    builtins.__hatchery_shell__ = _shell
    sys.stdout, sys.stderr = _Stream("stdout", 1), _Stream("stderr", 2)
    _streams = (sys.stdout, sys.stderr)
    requests = open(3, "rb")
    _emit({"type": "ready", "pid": os.getpid(), "language": "python",
           "version": platform.python_version()})
    while True:
        try:
            line = requests.readline()
            if not line:
                return  # the agent closed fd 3: exit 0
            try:
                _handle(line)
            except Exception as exc:  # a kernel bug must not end the session
                _kernel_error("internal error: %r" % exc)
            finally:
                _flush_streams()
                _emit({"id": _current_id, "type": "done", "execution_count": _count})
        except KeyboardInterrupt:
            pass  # an interrupt outside user code (idle, or between events): nothing to stop


if __name__ == "__main__":
    main()
