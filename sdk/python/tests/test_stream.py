import threading
import time

import pytest

from hatchery import Client, ExecResult, OutputChunk, SandboxTimeout, StreamError

import support


def test_stream_iterates_chunks_in_order(sbx):
    stream = sbx.exec_stream("for i in 1 2 3; do echo $i; sleep 0.3; done; echo oops >&2; exit 3")
    seen, times = [], []
    for chunk in stream:
        assert isinstance(chunk, OutputChunk)
        seen.append((chunk.stream, chunk.data))
        times.append(time.time())
    assert seen == [("stdout", "1\n"), ("stdout", "2\n"), ("stdout", "3\n"), ("stderr", "oops\n")]
    assert times[2] - times[0] > 0.4  # delivered as produced, not at the end
    r = stream.result
    assert isinstance(r, ExecResult) and r.exit_code == 3 and r.stdout == "1\n2\n3\n" and r.stderr == "oops\n"
    assert list(stream) == []


def test_stream_callbacks_and_wait(sbx):
    out, err = [], []
    r = sbx.exec_stream("echo a; echo b >&2; echo c", on_stdout=out.append, on_stderr=err.append,
                        cwd="/workspace", env={"X": "1"}).wait()
    assert "".join(out) == "a\nc\n" and err == ["b\n"] and r.exit_code == 0 and r.stdout == "a\nc\n"
    r = sbx.exec_stream("cat; echo $X", stdin="in\n", env={"X": "y"}, timeout_seconds=5).wait()
    assert r.stdout == "in\ny\n"
    r = sbx.exec_stream("sleep 10", timeout_seconds=1).wait()
    assert r.timed_out and r.exit_code == 137


def test_closing_the_stream_kills_the_command(sbx):
    with sbx.exec_stream("echo started; sleep 3; touch /tmp/after") as stream:
        assert next(stream).data == "started\n"
    time.sleep(4)
    assert not sbx.filesystem.exists("/tmp/after")


def test_error_event_raises_typed_error(daemon, client, sbx):
    """Killing the sandbox under a running stream ends it with an error
    event (guest_unresponsive), which raises like the HTTP status would."""
    stream = sbx.exec_stream("echo go; sleep 30")
    assert next(stream).data == "go\n"
    threading.Timer(0.5, sbx.kill).start()
    with pytest.raises(SandboxTimeout) as e:
        list(stream)
    assert e.value.code == "guest_unresponsive"


def test_stream_ending_without_exit_raises(proxy, sbx):
    """A connection that drops mid-stream (a proxy cutting it after 40
    bytes) is an error, never a silent success."""
    c = Client(f"{proxy.url}/cut/40", support.KEY)
    s = type(sbx)(sbx.info, c)
    stream = s.exec_stream("echo one; sleep 0.5; echo two; sleep 0.5; echo three")
    with pytest.raises(StreamError):
        stream.wait()
    assert stream.result is None
