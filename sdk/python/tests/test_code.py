"""run_code and code contexts (the E2B code interpreter's surface), and the
exec fields that came with them (reason, contained, cpu_limit_ms). The
default context is already running in every sandbox, so each run takes
milliseconds; only the timeout test waits (2 s)."""

import asyncio
import time

import pytest

from hatchery import (BadRequest, CodeContext, Execution, ExecutionError, Logs, NotFound, Result, StreamError,
                      TooLarge)
from hatchery.aio import AsyncSandbox

import support

HTML = '''
class Card:
    def _repr_html_(self):
        return "<b>card</b>"
    def _repr_markdown_(self):
        return "**card**"
    def _repr_json_(self):
        return {"kind": "card", "n": [1, 2]}
    def __repr__(self):
        return "Card()"
display(Card())
'''


def test_logs_main_result_and_state(sbx):
    ex = sbx.run_code("x = 41\nprint('hi')\nx + 1")
    assert isinstance(ex, Execution) and isinstance(ex.logs, Logs)
    assert ex.logs.stdout == ["hi\n"] and ex.logs.stderr == []
    assert ex.text == "42" and len(ex.results) == 1 and ex.results[0].is_main_result
    assert ex.error is None and ex.ok and ex.reason == "exited" and not ex.restarted and not ex.truncated
    assert ex.context_id == "default" and ex.duration_ms >= 0 and ex.cpu_ms >= 0 and not ex.oom_killed
    assert ex.memory_peak_bytes is None or ex.memory_peak_bytes > 0
    n = ex.execution_count
    # Variables persist in the default context.
    again = sbx.run_code("import sys\nprint('err', file=sys.stderr)\nx")
    assert again.text == "41" and again.logs.stderr == ["err\n"] and again.execution_count == n + 1
    # A statement has no main result; envs are set for this run only.
    quiet = sbx.run_code("import os\nprint(os.environ['GREETING'])", envs={"GREETING": "hello"})
    assert quiet.results == [] and quiet.text is None and quiet.logs.stdout == ["hello\n"]
    assert sbx.run_code("import os\nrepr(os.environ.get('GREETING'))").text == "'None'"
    assert sbx.run_code("None").results == []  # like Jupyter: a None value is not shown


def test_rich_results(sbx):
    ex = sbx.run_code(HTML + "Card()")
    assert [r.is_main_result for r in ex.results] == [False, True]
    shown = ex.results[0]
    assert isinstance(shown, Result)
    assert shown.html == "<b>card</b>" and shown.markdown == "**card**" and shown.text == "Card()"
    assert shown.json == {"kind": "card", "n": [1, 2]} and shown.png is None and shown.svg is None
    assert set(shown.formats()) == {"html", "markdown", "json"}
    assert shown.data["text/html"] == "<b>card</b>" and str(shown) == "Card()"
    assert shown._repr_html_() == "<b>card</b>"
    assert ex.text == "Card()" and ex.results[1].html == "<b>card</b>"
    assert sbx.run_code("42").results[0].formats() == []


def test_exception_is_an_error_not_a_raise(sbx):
    ex = sbx.run_code("print('before')\n1 / 0")
    assert isinstance(ex.error, ExecutionError)
    assert ex.error.name == "ZeroDivisionError" and ex.error.value == "division by zero"
    assert "Traceback" in ex.error.traceback and "1 / 0" in ex.error.traceback
    assert ex.logs.stdout == ["before\n"] and ex.results == [] and ex.text is None
    assert ex.reason == "exited" and not ex.ok and not ex.restarted
    # The context survives its exception.
    assert sbx.run_code("'still here'").text == "'still here'"


def test_streamed_run_calls_back_in_order(sbx):
    events = []
    t0 = time.time()
    ex = sbx.run_code(
        "import sys, time\nprint('one', flush=True)\ntime.sleep(0.4)\nprint('two', file=sys.stderr)\n"
        "display(7)\n8",
        on_stdout=lambda s: events.append(("stdout", s, time.time())),
        on_stderr=lambda s: events.append(("stderr", s, time.time())),
        on_result=lambda r: events.append(("result", r, time.time())))
    done = time.time()
    # print() writes its text and its newline separately: one chunk each.
    kinds = [k for i, (k, _, _) in enumerate(events) if i == 0 or events[i - 1][0] != k or k == "result"]
    assert kinds == ["stdout", "stderr", "result", "result"], events
    assert "".join(e[1] for e in events if e[0] == "stdout") == "one\n"
    assert "".join(e[1] for e in events if e[0] == "stderr") == "two\n"
    assert events[-2][1].text == "7" and not events[-2][1].is_main_result and events[-1][1].is_main_result
    assert events[0][2] - t0 < done - t0 - 0.3  # stdout came as printed, well before the end
    assert "".join(ex.logs.stdout) == "one\n" and "".join(ex.logs.stderr) == "two\n" and ex.text == "8"
    assert [r.text for r in ex.results] == ["7", "8"] and ex.reason == "exited"

    errs = []
    ex = sbx.run_code("raise KeyError('k')", on_error=errs.append)
    assert [e.name for e in errs] == ["KeyError"] and ex.error == errs[0] and ex.error.value == "'k'"

    # A callback that raises cancels the run and propagates.
    def boom(_):
        raise RuntimeError("callback failed")
    with pytest.raises(RuntimeError):
        sbx.run_code("print('x')", on_stdout=boom)


def test_contexts_are_separate_restartable_removable(sbx):
    sbx.run_code("shared = 'default'")
    ctx = sbx.create_code_context(cwd="/tmp")
    assert isinstance(ctx, CodeContext) and ctx.id.startswith("ctx_") and ctx.language == "python"
    assert ctx.cwd == "/tmp" and ctx.execution_count == 0
    ex = sbx.run_code("shared", context=ctx)
    assert ex.error.name == "NameError" and ex.context_id == ctx.id
    assert sbx.run_code("import os\nos.getcwd()", context=ctx).text == "'/tmp'"
    sbx.run_code("mine = 1", context=ctx.id)  # an id works as well
    assert sbx.run_code("mine").error.name == "NameError"
    assert sbx.run_code("shared").text == "'default'"
    listed = {c.id: c for c in sbx.list_code_contexts()}
    assert set(listed) == {"default", ctx.id} and listed[ctx.id].execution_count == 3

    restarted = sbx.restart_code_context(ctx)
    assert restarted.id == ctx.id and restarted.execution_count == 0
    assert sbx.run_code("mine", context=ctx).error.name == "NameError"

    sbx.remove_code_context(ctx)
    with pytest.raises(NotFound) as e:
        sbx.run_code("1", context=ctx)
    assert e.value.code == "context_not_found"
    with pytest.raises(NotFound):  # the stream reports it as a `failed` event
        sbx.run_code("1", context=ctx, on_stdout=print)
    with pytest.raises(NotFound):
        sbx.restart_code_context(ctx.id)
    with pytest.raises(BadRequest):
        sbx.remove_code_context("default")
    assert [c.id for c in sbx.list_code_contexts()] == ["default"]


def test_bad_requests(sbx):
    with pytest.raises(BadRequest) as e:
        sbx.run_code("1", language="cobol")
    assert e.value.status == 400
    with pytest.raises(BadRequest):
        sbx.create_code_context(language="cobol")
    with pytest.raises(TooLarge) as e:
        sbx.run_code("#" * (256 * 1024 + 1))
    assert e.value.status == 413 and e.value.code == "too_large"
    assert sbx.run_code("#" * (256 * 1024)).ok  # exactly the limit is fine
    with pytest.raises(BadRequest):
        sbx.run_code("1", timeout=2, cpu_limit_ms=2001)


def test_timeout_restarts_the_context(sbx):
    sbx.run_code("before = 1")
    t = time.time()
    ex = sbx.run_code("while True: pass", timeout=2)
    assert ex.reason == "timeout" and ex.restarted and 1.9 < time.time() - t < 10
    after = sbx.run_code("'alive'")
    assert after.text == "'alive'" and after.ok
    assert sbx.run_code("before").error.name == "NameError"  # a clean interpreter
    ex = sbx.run_code("while True: pass", cpu_limit_ms=300)
    assert ex.reason == "cpu_limit" and ex.restarted and ex.cpu_ms >= 250
    assert sbx.run_code("1 + 1").text == "2"


def test_exec_reason_contained_cpu_limit(sbx):
    r = sbx.exec("echo hi")
    assert r.reason == "exited" and r.contained is True and r.exit_code == 0
    assert r.memory_peak_bytes is None or isinstance(r.memory_peak_bytes, int)
    r = sbx.exec("python3 -c 'while True: pass'", cpu_limit_ms=300, timeout_seconds=10)
    assert r.reason == "cpu_limit" and r.exit_code == 137 and not r.timed_out and r.cpu_ms >= 250
    assert sbx.exec("kill -TERM $$").reason == "signaled"
    assert sbx.exec("yes", max_output_bytes=1000).reason == "output_limit"
    streamed = sbx.exec_stream("python3 -c 'while True: pass'", cpu_limit_ms=200).wait()
    assert streamed.reason == "cpu_limit" and streamed.contained


def test_stream_without_done_raises(proxy, sbx):
    from hatchery import Client, Sandbox
    cut = Sandbox(sbx.info, Client(f"{proxy.url}/cut/40", support.KEY))
    with pytest.raises(StreamError):
        cut.run_code("import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.2)",
                     on_stdout=lambda s: None)


def test_async_run_code_and_contexts(daemon, client):
    async def main():
        async with await AsyncSandbox.create(ttl_seconds=60, client=client) as s:
            daemon.created.add(s.id)
            out, results = [], []

            async def on_stdout(chunk):  # an async callback is awaited on this loop
                await asyncio.sleep(0)
                out.append(chunk)

            ex = await s.run_code("print('a')\nprint('b')\n3", on_stdout=on_stdout,
                                  on_result=lambda r: results.append(r.text))
            assert "".join(out) == "a\nb\n" and results == ["3"] and ex.text == "3"
            assert (await s.run_code("v = 5\nv")).text == "5"
            ctx = await s.create_code_context()
            assert (await s.run_code("v", context=ctx)).error.name == "NameError"
            assert {c.id for c in await s.list_code_contexts()} == {"default", ctx.id}
            assert (await s.restart_code_context(ctx)).execution_count == 0
            await s.remove_code_context(ctx)
            with pytest.raises(NotFound):
                await s.run_code("1", context=ctx)

    asyncio.run(main())
