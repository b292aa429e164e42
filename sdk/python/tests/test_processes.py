"""Background processes (exec background=True) and raw output
(output="base64"), against the live daemon."""

import asyncio
import dataclasses
import time

import pytest

from hatchery import (BadRequest, Client, Conflict, NotFound, Process, ProcessChunk, ProcessInfo, RateLimited,
                      Sandbox)
from hatchery.aio import AsyncProcess, AsyncSandbox

import support


def text(chunks, stream="stdout"):
    return "".join(c.data for c in chunks if c.stream == stream)


def test_background_start_list_and_follow_to_exit(sbx):
    t = time.time()
    proc = sbx.exec("for i in 1 2 3; do echo line$i; sleep 0.2; done; echo err >&2; exit 7", background=True)
    assert time.time() - t < 1.0, "a background start answers at once"
    assert isinstance(proc, Process) and isinstance(proc.info, ProcessInfo)
    assert proc.id.startswith("proc_") and len(proc.id) == 21 and isinstance(proc.pid, int)
    assert proc.running and proc.state == "running" and proc.exit_code is None and proc.argv[0] == "/bin/sh"
    assert [p.id for p in sbx.processes()] == [proc.id]

    out = proc.output()
    chunks = list(out)
    assert all(isinstance(c, ProcessChunk) for c in chunks)
    assert text(chunks) == "line1\nline2\nline3\n" and text(chunks, "stderr") == "err\n"
    assert chunks[0].offset == 0 and [c.offset for c in chunks] == sorted(c.offset for c in chunks)
    assert out.exited and out.info.state == "exited" and out.info.exit_code == 7 and out.info.reason == "exited"
    assert out.next_offset == out.info.output_bytes == 22
    assert proc.exit_code == 7 and proc.state == "exited", "the output's end updates the Process"
    assert list(out) == []
    # Iterating the process itself replays its output from the start.
    assert text(proc) == "line1\nline2\nline3\n"
    listed = sbx.processes()
    assert [(p.id, p.state, p.exit_code) for p in listed] == [(proc.id, "exited", 7)]
    assert proc.refresh().exit_code == 7 and not proc.running


def test_reconnect_from_an_offset(sbx):
    proc = sbx.exec("i=0; while [ $i -lt 20 ]; do echo tick$i; i=$((i+1)); sleep 0.03; done", background=True)
    with proc.output() as out:
        first = next(out)
    assert first.data.startswith("tick0\n") and first.offset == 0
    # Another handle on the same process, by its id (as another program would).
    again = sbx.process(proc.id)
    assert again.id == proc.id and again.pid == proc.pid
    rest = again.output(offset=first.end_offset)
    assert first.data + text(rest) == "".join(f"tick{i}\n" for i in range(20))
    assert rest.info.exit_code == 0
    # Not following: what is there so far, then the end.
    tail = list(proc.output(offset=first.end_offset, follow=False))
    assert "".join(c.data for c in tail).endswith("tick19\n")

    slow = sbx.exec("echo started; sleep 30", background=True)
    proc.wait(timeout=5)
    deadline = time.time() + 5
    while slow.refresh().output_bytes == 0 and time.time() < deadline:
        time.sleep(0.05)
    out = slow.output(follow=False)
    assert text(out) == "started\n"
    assert out.info.running and not out.exited and out.next_offset == 8
    slow.kill()


def test_stdin_lines_then_close(sbx):
    proc = sbx.exec("while read l; do echo got:$l; done; echo bye", background=True)
    assert proc.stdin_open
    proc.send_stdin("one\n")
    proc.send_stdin(b"two\n")
    proc.close_stdin()
    info = proc.wait(timeout=10)
    assert info.state == "exited" and info.exit_code == 0 and not info.stdin_open
    assert proc.exit_code == 0, "wait updates the handle"
    assert text(proc.output(follow=False)) == "got:one\ngot:two\nbye\n"
    with pytest.raises(Conflict):
        proc.send_stdin("late\n")


def test_signal_with_a_trap(sbx):
    proc = sbx.exec("trap 'echo term; exit 3' TERM; echo ready; while :; do sleep 0.1; done", background=True)
    out = proc.output()
    seen = []
    for chunk in out:
        seen.append(chunk.data)
        if "ready" in "".join(seen):
            break
    info = proc.signal("SIGTERM")
    assert isinstance(info, ProcessInfo)
    rest = list(out)  # the same stream, on to the exit
    assert "term\n" in "".join(seen) + text(rest)
    assert out.info.exit_code == 3 and out.info.reason == "exited"
    with pytest.raises(BadRequest):
        proc.signal("SIGSEGV")


def test_wait_with_a_short_timeout_then_kill(sbx):
    proc = sbx.exec("setsid sleep 321 & exec sleep 322", background=True)
    t = time.time()
    info = proc.wait(timeout=1)
    assert info.state == "running" and proc.running
    assert 0.8 <= time.time() - t < 2.5
    info = proc.kill()
    assert info.state == "exited" and info.reason == "cancelled" and proc.reason == "cancelled"
    assert proc.wait().reason == "cancelled", "waiting on an exited process answers at once"
    left = sbx.exec("ps -eo args --no-headers | grep -c '^sleep 32[12]' || true").stdout
    assert left.strip() == "0", "the kill took everything it started"


def test_process_ids_name_a_process_in_one_sandbox(daemon, client, sbx):
    proc = sbx.exec("sleep 30", background=True)
    with Sandbox.create(ttl_seconds=60, client=client) as other:
        daemon.created.add(other.id)
        with pytest.raises(NotFound) as e:
            other.process(proc.id)
        assert e.value.code == "process_not_found" and e.value.status == 404
        with pytest.raises(NotFound):
            Process(proc.info, other).kill()
        assert other.processes() == []
    with pytest.raises(BadRequest):
        sbx.process("1234")
    assert sbx.process(proc).running
    proc.kill()


def test_the_17th_running_process_is_rate_limited(sbx):
    # too_many carries no Retry-After (docs/api.md, Errors): retrying soon
    # would fail the same way, so even a client with retries does not wait.
    s = Sandbox(sbx.info, Client(sbx._client.url, support.KEY))
    procs = [s.exec(argv=["sleep", "60"], background=True) for _ in range(16)]
    with pytest.raises(RateLimited) as e:
        s.exec(argv=["sleep", "60"], background=True)
    assert e.value.status == 429 and e.value.code == "too_many" and e.value.retry_after is None
    procs[0].kill()
    assert s.exec("true", background=True).id.startswith("proc_")
    assert len(s.processes()) == 17


def test_base64_output_is_the_exact_bytes(sbx):
    r = sbx.exec("printf '\\377\\000'", output="base64")
    assert r.stdout_bytes == b"\xff\x00" and r.stderr_bytes == b""
    assert r.stdout == "\ufffd\x00" and r.exit_code == 0
    r = sbx.exec("printf '\\377'")
    assert r.stdout == "\ufffd" and r.stdout_bytes == "\ufffd".encode()
    stream = sbx.exec_stream("printf '\\377'; printf '\\001' >&2", output="base64")
    assert [(c.stream, c.data) for c in stream] == [("stdout", b"\xff"), ("stderr", b"\x01")]
    assert stream.result.stdout_bytes == b"\xff" and stream.result.stderr_bytes == b"\x01"
    proc = sbx.exec("printf '\\377\\000'", background=True, output="base64")
    chunks = list(proc.output(encoding="base64"))
    assert b"".join(c.data for c in chunks) == b"\xff\x00" and chunks[-1].end_offset == 2
    with pytest.raises(ValueError):
        sbx.exec("true", output="hex")


def test_async_background_process(sbx):
    async def main():
        s = AsyncSandbox(sbx)
        proc = await s.exec("read l; echo got:$l; sleep 0.2; echo done", background=True)
        assert isinstance(proc, AsyncProcess) and proc.running
        await proc.send_stdin("x\n")
        seen = [c.data async for c in proc]
        assert "".join(seen) == "got:x\ndone\n"
        assert (await proc.wait(timeout=5)).exit_code == 0
        assert [p.id for p in await s.processes()] == [proc.id]
        again = await s.process(proc.id)
        out = again.output(follow=False)
        assert "".join([c.data async for c in out]) == "got:x\ndone\n"
        assert out.info.exit_code == 0
        ghost = AsyncProcess(Process(dataclasses.replace(proc.info, id="proc_0000000000000000"), sbx))
        out = ghost.output()  # opens on the first chunk: that is where the 404 raises
        with pytest.raises(NotFound):
            async for _ in out:
                pass
        sleeper = await s.exec("sleep 30", background=True)
        assert (await sleeper.wait(timeout=0)).state == "running"
        assert (await sleeper.kill()).reason == "cancelled"
        assert (await s.exec("echo sync")).stdout == "sync\n"

    asyncio.run(main())
