"""The official `e2b` and `e2b-code-interpreter` Python packages (from PyPI,
in a fresh venv: see the Makefile's e2b-test) against a live daemon."""

import threading
import time

import pytest
from e2b import (
    CommandExitException,
    FilesystemEventType,
    NotFoundException,
    PtySize,
    Sandbox,
    SandboxQuery,
    SandboxState,
    TimeoutException,
)


def test_create_info_and_commands(sbx):
    info = sbx.get_info()
    assert info.sandbox_id == sbx.sandbox_id and info.state.value == "running"
    assert info.template_id == "base" and info.cpu_count >= 1 and info.memory_mb == 512
    r = sbx.commands.run("echo hi; whoami; pwd; echo oops >&2")
    assert (r.stdout, r.stderr, r.exit_code) == ("hi\nuser\n/home/user\n", "oops\n", 0)
    # Another user and directory, env vars, streaming callbacks.
    seen = []
    r = sbx.commands.run("echo $FOO; whoami; pwd", user="root", cwd="/tmp", envs={"FOO": "bar"},
                         on_stdout=seen.append)
    assert r.stdout == "bar\nroot\n/tmp\n" and "".join(seen) == r.stdout
    assert sbx.is_running()


def test_nonzero_exit_raises(sbx):
    with pytest.raises(CommandExitException) as e:
        sbx.commands.run("echo out; echo err >&2; exit 3")
    assert e.value.exit_code == 3 and e.value.stdout == "out\n" and e.value.stderr == "err\n"


def test_timeout_kills_the_command(sbx):
    t = time.time()
    with pytest.raises(TimeoutException):
        sbx.commands.run("sleep 30", timeout=2)
    assert time.time() - t < 20
    # The deadline was the process's lifetime: nothing is left running.
    time.sleep(1)
    assert not [p for p in sbx.commands.list() if "sleep" in " ".join(p.args)]


def test_background_stdin_list_connect_and_kill(sbx):
    h = sbx.commands.run("read line; echo got:$line; sleep 0.2; echo done", background=True, stdin=True)
    assert h.pid in [p.pid for p in sbx.commands.list()]
    sbx.commands.send_stdin(h.pid, "abc\n")
    r = h.wait()
    assert r.stdout == "got:abc\ndone\n" and r.exit_code == 0
    # close_stdin gives EOF.
    h = sbx.commands.run("cat; echo eof", background=True, stdin=True)
    sbx.commands.send_stdin(h.pid, "x\n")
    sbx.commands.close_stdin(h.pid)
    assert h.wait().stdout == "x\neof\n"
    # Disconnect, then connect again by pid; then kill.
    h = sbx.commands.run("echo start; sleep 60", background=True)
    time.sleep(1)  # so that "start" has been written
    h.disconnect()
    h2 = sbx.commands.connect(h.pid)
    assert sbx.commands.kill(h.pid) is True
    with pytest.raises(CommandExitException) as e:
        h2.wait()
    assert e.value.exit_code == 137 and "start" in e.value.stdout
    assert sbx.commands.kill(h.pid) is False
    assert h.pid not in [p.pid for p in sbx.commands.list()]


def test_a_command_streaming_when_its_sandbox_is_killed_says_so(daemon):
    # E2B's test_sandbox_killed_during_run: the stream's connection drops and
    # /health fails (502), so the SDK reports the kill, not an error answer.
    s = Sandbox.create("base", timeout=300)
    h = s.commands.run("echo started; sleep 60", background=True)
    time.sleep(0.5)
    s.kill()
    with pytest.raises(TimeoutException) as e:
        h.wait()
    assert "sandbox was killed or reached its end of life" in str(e.value)
    # The same for a command run in the foreground while the kill happens.
    s = Sandbox.create("base", timeout=300)
    threading.Timer(1.5, s.kill).start()
    with pytest.raises(TimeoutException) as e:
        s.commands.run("sleep 60", timeout=120)
    assert "sandbox was killed or reached its end of life" in str(e.value)


def test_files(sbx):
    info = sbx.files.write("notes/a.txt", "hello")  # relative: under /home/user
    assert info.path == "/home/user/notes/a.txt"
    assert sbx.files.read("/home/user/notes/a.txt") == "hello"
    assert bytes(sbx.files.read("notes/a.txt", format="bytes")) == b"hello"
    sbx.files.write_files([{"path": "/home/user/notes/b.bin", "data": b"\x00\x01"},
                           {"path": "/home/user/notes/sub/c.txt", "data": "c"}])
    # Owned by the user that wrote it, so commands as that user can change it.
    sbx.commands.run("echo more >> /home/user/notes/a.txt")
    assert sbx.files.get_info("/home/user/notes/a.txt").owner == "user"
    names = sorted(e.name for e in sbx.files.list("/home/user/notes"))
    assert names == ["a.txt", "b.bin", "sub"]
    deep = sorted(e.path for e in sbx.files.list("/home/user/notes", depth=2))
    assert "/home/user/notes/sub/c.txt" in deep
    assert sbx.files.make_dir("/home/user/new/dir") is True
    assert sbx.files.make_dir("/home/user/new/dir") is False
    moved = sbx.files.rename("/home/user/notes/a.txt", "/home/user/new/a.txt")
    assert moved.path == "/home/user/new/a.txt" and moved.type.value == "file"
    assert sbx.files.exists("/home/user/new/a.txt") and not sbx.files.exists("/home/user/notes/a.txt")
    sbx.files.remove("/home/user/notes")
    assert not sbx.files.exists("/home/user/notes/sub/c.txt")
    with pytest.raises(NotFoundException):
        sbx.files.read("/home/user/missing.txt")
    with pytest.raises(NotFoundException):
        sbx.files.list("/home/user/missing")


def test_watch_dir(sbx):
    sbx.files.make_dir("/home/user/w")
    w = sbx.files.watch_dir("/home/user/w")
    sbx.files.write("/home/user/w/x.txt", "1")
    sbx.commands.run("mv /home/user/w/x.txt /home/user/w/y.txt; rm /home/user/w/y.txt")
    events = []
    deadline = time.time() + 20
    while time.time() < deadline and FilesystemEventType.REMOVE not in [e.type for e in events]:
        events += w.get_new_events()
        time.sleep(0.2)
    w.stop()
    kinds = {(e.name, e.type) for e in events}
    assert ("x.txt", FilesystemEventType.CREATE) in kinds
    assert ("x.txt", FilesystemEventType.RENAME) in kinds
    assert ("y.txt", FilesystemEventType.REMOVE) in kinds
    # The watcher's process is gone once stopped.
    time.sleep(0.5)
    assert not [p for p in sbx.commands.list() if "watch" in " ".join(p.args)]


def test_pty(sbx):
    h = sbx.pty.create(PtySize(cols=80, rows=24))
    sbx.pty.resize(h.pid, PtySize(cols=100, rows=30))
    sbx.pty.send_stdin(h.pid, b"stty size; echo pty-$((6*7)); exit 7\n")
    out = []
    with pytest.raises(CommandExitException) as e:
        h.wait(on_pty=out.append)
    assert e.value.exit_code == 7
    text = b"".join(out)
    assert b"30 100" in text and b"pty-42" in text
    # Disconnect, connect again (the terminal ran on meanwhile), finish.
    h = sbx.pty.create(PtySize(cols=80, rows=24))
    h.disconnect()
    assert h.pid in [p.pid for p in sbx.commands.list()]
    h2 = sbx.pty.connect(h.pid)
    sbx.pty.send_stdin(h.pid, b"echo again-$((1+1)); exit 0\n")
    out = []
    assert h2.wait(on_pty=out.append).exit_code == 0
    assert b"again-2" in b"".join(out)
    h = sbx.pty.create(PtySize(cols=80, rows=24))
    assert sbx.pty.kill(h.pid) is True
    time.sleep(0.5)
    assert h.pid not in [p.pid for p in sbx.commands.list()]


def test_list_by_metadata_set_timeout_and_kill(daemon):
    tag = f"t{time.time_ns()}"
    a = Sandbox.create("base", metadata={"suite": tag, "n": "1"})
    b = Sandbox.create("base", metadata={"suite": tag, "n": "2"})
    try:
        found = Sandbox.list(query=SandboxQuery(metadata={"suite": tag})).next_items()
        assert sorted(x.sandbox_id for x in found) == sorted([a.sandbox_id, b.sandbox_id])
        one = Sandbox.list(query=SandboxQuery(metadata={"suite": tag, "n": "2"})).next_items()
        assert [x.sandbox_id for x in one] == [b.sandbox_id]
        # Pagination: one per page, X-Next-Token carries on.
        p = Sandbox.list(query=SandboxQuery(metadata={"suite": tag}), limit=1)
        pages = [x.sandbox_id for x in p.next_items()]
        assert p.has_next
        pages += [x.sandbox_id for x in p.next_items()]
        assert sorted(pages) == sorted([a.sandbox_id, b.sandbox_id])
        before = a.get_info().end_at
        a.set_timeout(1800)
        after = a.get_info().end_at
        assert (after - before).total_seconds() > 1000
    finally:
        assert a.kill() is True
        b.kill()
    assert Sandbox.kill(a.sandbox_id) is False
    assert not Sandbox.list(query=SandboxQuery(metadata={"suite": tag})).next_items()


def test_pause_and_resume_keep_state_and_id(daemon):
    s = Sandbox.create("base", metadata={"p": "1"})
    try:
        s.files.write("/home/user/state.txt", "kept")
        h = s.commands.run("i=0; while true; do i=$((i+1)); echo $i > /tmp/n; sleep 0.2; done", background=True)
        assert s.pause() is True
        assert s.get_info().state.value == "paused"
        paused = Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED])).next_items()
        assert s.sandbox_id in [x.sandbox_id for x in paused]
        back = Sandbox.connect(s.sandbox_id)
        assert back.sandbox_id == s.sandbox_id
        assert back.get_info().state.value == "running"
        assert back.files.read("/home/user/state.txt") == "kept"
        # The running process came back with the memory snapshot.
        a = int(back.commands.run("cat /tmp/n").stdout)
        time.sleep(1)
        assert int(back.commands.run("cat /tmp/n").stdout) > a
        assert h.pid in [p.pid for p in back.commands.list()]
    finally:
        Sandbox.kill(s.sandbox_id)
    assert Sandbox.kill(s.sandbox_id) is False


def test_code_interpreter(daemon):
    from e2b_code_interpreter import Sandbox as CodeSandbox
    c = CodeSandbox.create(timeout=300)  # code-interpreter-v1
    try:
        assert c.get_info().template_id == "code-interpreter"
        ex = c.run_code("x = 6 * 7\nprint('hi')\nx")
        assert "".join(ex.logs.stdout) == "hi\n" and ex.error is None
        assert ex.text == "42" and ex.results[0].is_main_result
        ex = c.run_code("class H:\n    def _repr_html_(self): return '<b>x</b>'\nH()")
        assert ex.results[0].html == "<b>x</b>"
        ex = c.run_code("1/0")
        assert ex.error.name == "ZeroDivisionError" and "division by zero" in ex.error.value
        seen = []
        c.run_code("import sys; print('a'); print('b', file=sys.stderr)", on_stdout=lambda m: seen.append(m.line),
                   on_stderr=lambda m: seen.append("err:" + m.line))
        assert "".join(seen).count("a") == 1 and any(x.startswith("err:") for x in seen)
        ctx = c.create_code_context()
        c.run_code("y = 5", context=ctx)
        assert c.run_code("y", context=ctx).text == "5"
        assert c.run_code("'y' in dir()").text == "False"  # the default context is another
        assert ctx.id in [x.id for x in c.list_code_contexts()]
        c.restart_code_context(ctx)
        assert c.run_code("'y' in dir()", context=ctx).text == "False"
        c.remove_code_context(ctx)
        assert ctx.id not in [x.id for x in c.list_code_contexts()]
    finally:
        c.kill()


def test_fork(sbx):
    sbx.files.write("/home/user/f.txt", "from the parent")
    forks = sbx.fork(count=2, timeout=120)
    try:
        assert len(forks) == 2 and all(isinstance(f, Sandbox) for f in forks), forks
        assert len({f.sandbox_id for f in forks} | {sbx.sandbox_id}) == 3
        for f in forks:
            assert f.files.read("/home/user/f.txt") == "from the parent"
            f.files.write("/home/user/f.txt", "changed")
        assert sbx.files.read("/home/user/f.txt") == "from the parent"
    finally:
        for f in forks:
            if isinstance(f, Sandbox):
                f.kill()


def test_paused_and_resumed_sandboxes_survive_a_daemon_restart(daemon):
    """The pause record and the resumed sandbox's E2B id are in Hatchery's
    own records (a snapshot's and a sandbox's metadata), not the daemon's
    memory: after a restart a paused sandbox is still listed and resumes
    under its id, and a resumed one still answers to it."""
    s = Sandbox.create("base", metadata={"keep": "me"})
    try:
        s.files.write("/home/user/state.txt", "across restarts")
        assert s.pause() is True
        daemon.stop()
        daemon.start()
        paused = Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED])).next_items()
        assert [x.metadata for x in paused if x.sandbox_id == s.sandbox_id] == [{"keep": "me"}]
        back = Sandbox.connect(s.sandbox_id)
        assert back.files.read("/home/user/state.txt") == "across restarts"
        daemon.stop()
        daemon.start()
        # Running under another Hatchery id, found by its E2B id.
        again = Sandbox.connect(s.sandbox_id)
        info = again.get_info()
        assert info.state.value == "running" and info.metadata == {"keep": "me"}, info
        assert again.files.read("/home/user/state.txt") == "across restarts"
        running = Sandbox.list(query=SandboxQuery(metadata={"keep": "me"})).next_items()
        assert [x.sandbox_id for x in running] == [s.sandbox_id]
    finally:
        Sandbox.kill(s.sandbox_id)
    assert Sandbox.kill(s.sandbox_id) is False
    assert Sandbox.list(query=SandboxQuery(metadata={"keep": "me"})).next_items() == []
