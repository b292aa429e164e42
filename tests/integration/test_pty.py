"""Terminals: GET /v1/sandboxes/{id}/pty is a WebSocket to a real
pseudo-terminal in the sandbox. Keystrokes and output round-trip, the
window size reaches the program, Ctrl-C interrupts the foreground job, and
every way a terminal ends (socket closed or dropped, idle timeout, sandbox
deleted, daemon stopped or dead) kills everything started in it. Bad input
is refused before the upgrade with a clear status, leaving nothing behind."""

import json
import re
import threading
import time
import urllib.parse

import pytest

from harness import KEY, Daemon, metric
from wsclient import Refused, Term, WebSocket

# One daemon for the module's tests (tests/integration/conftest.py).
SHARED_DAEMON = True

AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPT = "root@sandbox:"


def attach(daemon, sid, headers=AUTH, **query):
    qs = urllib.parse.urlencode({k: json.dumps(v) if k in ("argv", "env") else v for k, v in query.items()})
    return Term(WebSocket(daemon.port, f"/v1/sandboxes/{sid}/pty" + (f"?{qs}" if qs else ""), headers))


def refused(daemon, path, headers=AUTH):
    with pytest.raises(Refused) as e:
        WebSocket(daemon.port, path, headers)
    return e.value


def shell(daemon, sid, **query):
    t = attach(daemon, sid, **query)
    t.wait_for(PROMPT)
    return t


def run(t, line, marker, timeout=20):
    """Types a command line and waits for `marker` in what follows the
    line's echo (up to its CRLF: a prompt redrawn on SIGWINCH has none)."""
    m = t.mark()
    t.type(line + "\r")
    echoed = t.wait_for("\r\n", start=m, timeout=timeout)
    end = t.wait_for(marker, start=echoed, timeout=timeout)
    return t.out[m:end].decode(errors="replace")


def procs(daemon, sid, pattern):
    r = daemon.exec(sid, f"ps -eo args --no-headers | grep -E '{pattern}' | grep -v grep || true")
    return [l for l in r["stdout"].splitlines() if l.strip()]


def wait_no_procs(daemon, sid, pattern, timeout=10):
    deadline = time.time() + timeout
    while True:
        left = procs(daemon, sid, pattern)
        if not left or time.time() > deadline:
            return left
        time.sleep(0.2)


@pytest.mark.fresh_daemon  # reads absolute terminal counters
def test_echo_round_trip_on_a_real_terminal(daemon, sandbox):
    t = shell(daemon, sandbox)
    out = run(t, "echo hi; tty; echo $TERM; ps -o stat= -p $$; pwd", PROMPT)
    assert re.search(r"\rhi\r\n", out), out
    assert re.search(r"/dev/pts/\d+\r\n", out), out
    assert "xterm-256color" in out
    # The shell leads its own session (s); a login shell starts at home.
    assert "\r\nSs\r\n" in out, out
    assert "/root\r\n" in out
    t.type("exit 3\r")
    assert t.wait_control("exit") == {"type": "exit", "exit_code": 3, "signal": None, "reason": "exited",
                                      "oom_killed": False}
    assert t.wait_closed() == (1000, "exited")
    assert metric(daemon, "hatchery_terminals_open") == 0
    assert metric(daemon, "hatchery_terminals_opened_total") == 1


def test_resize_reaches_the_program(daemon, sandbox):
    t = shell(daemon, sandbox, cols=100, rows=30)
    assert "30 100" in run(t, "stty size", PROMPT)
    t.resize(132, 43)
    assert t.wait_control("resized") == {"type": "resized", "cols": 132, "rows": 43}
    # (bash redraws its prompt on the SIGWINCH too, so wait for the size.)
    run(t, "stty size", "43 132\r\n")
    # A foreground program gets SIGWINCH and sees the new size.
    run(t, "python3 -c \"import os,signal; signal.signal(signal.SIGWINCH, lambda *a: "
           "print('winch', *os.get_terminal_size(), flush=True)); print('ready', flush=True); "
           "signal.pause()\"", "ready\r\n")
    m = t.mark()
    t.resize(90, 20)
    t.wait_for("winch 90 20", start=m)
    t.type("\x03")
    t.wait_for(PROMPT, start=m)
    t.ws.close()


# GNU readline "touches" the window size each time bash prepares a new line
# (TIOCGWINSZ, then TIOCSWINSZ with what it read): a resize that lands
# between the two is written over with the old size. This program does the
# same with a pause the test controls, so the race is hit every time.
SLOW_TOUCH = ("python3 -c \"import fcntl,termios,sys; b=fcntl.ioctl(0, termios.TIOCGWINSZ, bytes(8)); "
              "print('re''ad', flush=True); sys.stdin.readline(); fcntl.ioctl(0, termios.TIOCSWINSZ, b); "
              "print('wro''te', flush=True)\"")


def test_a_resize_written_over_by_a_program_is_restored(daemon, sandbox):
    t = shell(daemon, sandbox, cols=100, rows=30)
    run(t, SLOW_TOUCH, "read\r\n")
    # Every resize is answered with the size the terminal reports after it.
    t.resize(120, 40)
    assert t.wait_control("resized") == {"type": "resized", "cols": 120, "rows": 40}
    # The program writes the size it read before the resize back.
    m = t.mark()
    t.type("\r")
    t.wait_for("wrote\r\n", start=m)
    t.wait_for(PROMPT, start=m)
    # The agent saw the terminal go back to exactly the previous size within
    # its watch after the resize, and set the new one again.
    time.sleep(0.2)
    assert "40 120" in run(t, "stty size", PROMPT)
    # A size a program picks itself (not the previous one) is its choice.
    run(t, "stty cols 90 rows 20", PROMPT)
    time.sleep(0.2)
    assert "20 90" in run(t, "stty size", PROMPT)
    t.ws.close()


def test_ctrl_c_interrupts_the_foreground_job(daemon, sandbox):
    t = shell(daemon, sandbox)
    m = t.mark()
    t.type("sleep 100\r")
    t.wait_for("sleep 100\r\n", start=m)
    time.sleep(0.5)
    t0 = time.time()
    t.type("\x03")
    t.wait_for(PROMPT, start=m + 12, timeout=5)
    assert time.time() - t0 < 3
    assert "130\r\n" in run(t, "echo $?", PROMPT)
    assert procs(daemon, sandbox, "^sleep 100") == []
    t.ws.close()


def test_full_screen_program_redraws_and_quits(daemon, sandbox):
    # The template has no vi or less: top is the full-screen program.
    t = shell(daemon, sandbox, cols=120, rows=40)
    m = t.mark()
    t.type("top -d 1\r")
    t.wait_for("load average", start=m)
    t.wait_for("\x1b[", start=m)  # it drives the screen with escapes
    m2 = t.mark()
    t.resize(100, 25)
    t.wait_for("load average", start=m2, timeout=5)
    t.type("q")
    t.wait_for(PROMPT, start=m2)
    run(t, "stty size", "25 100\r\n")
    t.ws.close()


def test_cmd_argv_env_and_cwd(daemon, sandbox):
    t = attach(daemon, sandbox, cmd="echo FOO=$FOO; pwd; exit 7", env={"FOO": "bar"}, cwd="/tmp")
    t.wait_for("/tmp\r\n")
    assert "FOO=bar\r\n" in t.text()
    assert t.wait_control("exit")["exit_code"] == 7
    assert t.wait_closed()[0] == 1000
    # An argv runs as the session leader, with the terminal as its
    # controlling tty (tcgetpgrp needs that) and itself in the foreground.
    t = attach(daemon, sandbox, argv=["python3", "-c", "import os,sys; "
                                      "print(os.getsid(0) == os.getpid(), os.tcgetpgrp(0) == os.getpgrp(), os.ttyname(1))"])
    t.wait_for("True True /dev/pts/")
    assert t.wait_control("exit")["exit_code"] == 0


def test_terminals_are_contained_like_exec(daemon, sandbox):
    t = attach(daemon, sandbox, cmd="cat /proc/self/cgroup; grep CapBnd /proc/self/status")
    t.wait_control("exit")
    out = t.text()
    # Its own unit (an in-guest cgroup), not the sandbox's root cgroup.
    assert re.search(r"pids:/e\d+", out), out
    cap_bnd = int(re.search(r"CapBnd:\s+([0-9a-f]+)", out).group(1), 16)
    assert not cap_bnd & (1 << 21), "CAP_SYS_ADMIN must not reach a terminal"


ESCAPERS = ("setsid sleep 333 & nohup sleep 334 >/dev/null 2>&1 & "
            "env -i /usr/bin/setsid /bin/sh -c 'sleep 335' & disown -a; echo st''arted")


@pytest.mark.parametrize("how", ["close_frame", "dropped_connection"])
def test_closing_the_socket_kills_everything_started_in_it(daemon, sandbox, how):
    t = shell(daemon, sandbox)
    run(t, ESCAPERS, "started\r\n")
    deadline = time.time() + 5
    while len(procs(daemon, sandbox, "^sleep 33[345]")) < 3:
        assert time.time() < deadline, procs(daemon, sandbox, "sleep")
        time.sleep(0.1)
    if how == "close_frame":
        t.ws.close()
    else:
        t.ws.shutdown()
    assert wait_no_procs(daemon, sandbox, "^sleep 33[345]|^/bin/bash -l") == []
    assert metric(daemon, "hatchery_terminals_open") == 0
    # The sandbox is fine, and the next terminal works.
    t = shell(daemon, sandbox)
    assert "ok\r\n" in run(t, "echo ok", PROMPT)
    t.ws.close()


def test_deleting_the_sandbox_closes_its_terminals(daemon, sandbox):
    t = shell(daemon, sandbox)
    assert daemon.delete(sandbox).status == 204
    assert t.wait_control("closed", timeout=20)["reason"] == "sandbox_gone"
    assert t.wait_closed()[0] == 1001


def test_output_flood_arrives_whole_and_exec_still_works(daemon, sandbox):
    t = shell(daemon, sandbox)
    m = t.mark()
    t.type("head -c 3000000 /dev/zero | base64 -w 1000; echo FLOOD-''DONE\r")
    t.wait_for("FLOOD-DONE\r\n", start=m, timeout=60)
    assert t.out.count(b"A" * 1000) >= 3000000 * 4 // 3 // 1000 - 1
    assert daemon.exec(sandbox, "echo side")["stdout"] == "side\n"
    t.ws.close()


def test_bad_control_messages_are_refused_and_ignored(daemon, sandbox):
    t = shell(daemon, sandbox, cols=100, rows=30)
    for msg in ({"type": "resize", "cols": 0, "rows": 0}, {"type": "resize", "cols": 1001, "rows": 20},
                {"type": "resize", "cols": 80, "rows": -1}, {"type": "resize", "cols": 80},
                {"type": "paste", "data": "x"}):
        t.ws.send_json(msg)
    t.ws.send_text("not json")
    deadline = time.time() + 10
    while len([c for c in t.controls if c["type"] == "error"]) < 6 and time.time() < deadline:
        t.pump(0.5)
    errors = [c for c in t.controls if c["type"] == "error"]
    assert [e["code"] for e in errors] == ["invalid_resize"] * 3 + ["invalid_message"] * 3, errors
    assert "between 1 and 1000" in errors[0]["message"]
    # Nothing changed and the terminal goes on.
    assert "30 100" in run(t, "stty size", PROMPT)
    t.ws.ping()
    t.ws.close()


def test_a_message_over_1_mib_closes_with_1009(daemon, sandbox):
    t = attach(daemon, sandbox, argv=["/bin/cat"])
    t.type(b"x" * (1 << 20))  # a 1 MiB paste is fine
    t.wait_for(b"x" * 1000)  # (the line discipline keeps 4 KiB of an unfinished line)
    # The server answers 1009 as soon as it has read the frame's header and
    # drops the connection with the rest unread, which can reset the socket
    # while this side is still sending: send from a thread and read the
    # close frame meanwhile, before any reset arrives.
    def send():
        try:
            t.type(b"y" * ((1 << 20) + 1))
        except (ConnectionResetError, BrokenPipeError):
            pass
    sender = threading.Thread(target=send)
    sender.start()
    assert t.wait_closed()[0] == 1009
    sender.join(20)
    assert wait_no_procs(daemon, sandbox, "^/bin/cat") == []


def test_bad_requests_are_refused_before_the_upgrade(daemon, sandbox):
    base = f"/v1/sandboxes/{sandbox}/pty"
    # No credentials, a wrong key, a bad token.
    r = refused(daemon, base, headers={})
    assert (r.status, r.error_code()) == (401, "unauthorized")
    assert refused(daemon, base, headers={"Authorization": "Bearer nope"}).status == 401
    assert refused(daemon, base + "?token=1.2.3", headers={}).status == 401
    # Out of range or malformed query values, unknown parameters.
    for q in ("cols=0", "rows=0", "cols=1001", "rows=100000", "cols=abc", "cmd=", "cmd=x&argv=%5B%22y%22%5D",
              "argv=nope", "argv=%5B%5D", "env=%5B%5D", "env=%7B%221x%22%3A%22y%22%7D", "cwd=relative", "bogus=1"):
        r = refused(daemon, f"{base}?{q}")
        assert r.status == 400, (q, r)
        assert r.error_code() in ("invalid_request", "invalid_query"), (q, r)
    assert "cols must be between 1 and 1000" in refused(daemon, base + "?cols=0").json()["error"]["message"]
    # No such sandbox, directory or command.
    r = refused(daemon, "/v1/sandboxes/sbx_0000000000000000/pty")
    assert (r.status, r.error_code()) == (404, "sandbox_not_found")
    r = refused(daemon, base + "?cwd=/nonexistent")
    assert (r.status, r.error_code()) == (404, "not_found"), r
    r = refused(daemon, base + "?argv=" + urllib.parse.quote('["no-such-program"]'))
    assert (r.status, r.error_code()) == (404, "not_found")
    assert "no-such-program" in r.json()["error"]["message"]
    # A plain GET is not an upgrade.
    r = daemon.request("GET", base)
    assert (r.status, r.error_code()) == (400, "not_a_websocket"), r
    # Nothing was left behind: no terminal, no process of one.
    assert metric(daemon, "hatchery_terminals_open") == 0
    assert procs(daemon, sandbox, "^/bin/bash -l|no-such") == []
    assert "ok\r\n" in run(shell(daemon, sandbox), "echo ok", PROMPT)


def test_browser_tokens_open_one_terminal_of_one_sandbox_once(daemon, sandbox):
    other = daemon.create(ttl_seconds=120)
    assert daemon.request("POST", f"/v1/sandboxes/{sandbox}/pty/token", auth=False).status == 401
    assert daemon.request("POST", "/v1/sandboxes/sbx_0000000000000000/pty/token").status == 404
    r = daemon.request("POST", f"/v1/sandboxes/{sandbox}/pty/token")
    assert r.status == 200, r
    body = r.json()
    assert set(body) == {"token", "expires_at"}
    token = urllib.parse.quote(body["token"])
    # A request that opens nothing (here a bad size) does not use it up ...
    assert refused(daemon, f"/v1/sandboxes/{sandbox}/pty?token={token}&cols=0", headers={}).status == 400
    # ... nor does one for another sandbox.
    r = refused(daemon, f"/v1/sandboxes/{other}/pty?token={token}", headers={})
    assert r.status == 401 and "not valid for this sandbox" in r.json()["error"]["message"]
    # ... for this one, once.
    t = Term(WebSocket(daemon.port, f"/v1/sandboxes/{sandbox}/pty?token={token}", {}))
    t.wait_for(PROMPT)
    assert "tok\r\n" in run(t, "echo tok", PROMPT)
    r = refused(daemon, f"/v1/sandboxes/{sandbox}/pty?token={token}", headers={})
    assert r.status == 401 and "used already" in r.json()["error"]["message"]
    # Tampered.
    forged = body["token"][:-2] + ("AA" if not body["token"].endswith("AA") else "BB")
    assert refused(daemon, f"/v1/sandboxes/{sandbox}/pty?token={urllib.parse.quote(forged)}", headers={}).status == 401
    t.ws.close()


def test_at_most_eight_terminals_per_sandbox(daemon, sandbox):
    terms = [attach(daemon, sandbox, argv=["/bin/sh"]) for _ in range(8)]
    for t in terms:
        t.wait_for("# ")
    r = refused(daemon, f"/v1/sandboxes/{sandbox}/pty?argv=%5B%22/bin/sh%22%5D")
    assert (r.status, r.error_code()) == (429, "too_many_terminals"), r
    # The caller's own cap: retrying in a second would not help, no hint.
    assert "retry-after" not in r.headers
    # Another sandbox has its own eight.
    other = daemon.create(ttl_seconds=120)
    attach(daemon, other, argv=["/bin/sh"]).wait_for("# ")
    terms[0].ws.close()
    terms[0].wait_closed()
    deadline = time.time() + 5
    while True:
        try:
            t = attach(daemon, sandbox, argv=["/bin/sh"])
            break
        except Refused:
            assert time.time() < deadline, "a closed terminal did not free its place"
            time.sleep(0.1)
    t.wait_for("# ")
    for t in terms[1:] + [t]:
        t.ws.close()


@pytest.fixture
def quick_idle():
    d = Daemon(extra_args=["--pool-size", "0", "--terminal-idle-timeout", "2", "--max-terminals", "2"]).start()
    yield d
    d.cleanup()


def test_idle_timeout_closes_the_terminal_and_kills_its_processes(quick_idle):
    d = quick_idle
    sid = d.create(ttl_seconds=120)
    # Output is not activity: a chatty terminal nobody types into is idle.
    t = shell(d, sid)
    run(t, "setsid sleep 336 & while :; do echo ti''ck; sleep 0.3; done", "tick\r\n")
    t0 = time.time()
    closed = t.wait_control("closed", timeout=10)
    assert closed["reason"] == "idle_timeout" and "2 s" in closed["message"], closed
    assert t.wait_closed() == (4000, "idle timeout")
    assert time.time() - t0 < 4
    assert wait_no_procs(d, sid, "^sleep 336|^/bin/bash -l") == []
    # Keystrokes and resizes are activity.
    t = shell(d, sid)
    for i in range(6):
        time.sleep(0.8)
        t.type(" \x7f") if i % 2 else t.resize(80 + i, 24)
    t.pump(0.1)
    assert t.closed is None and not [c for c in t.controls if c["type"] == "closed"]
    # --max-terminals is the per-sandbox cap.
    t2 = shell(d, sid)
    assert refused(d, f"/v1/sandboxes/{sid}/pty").status == 429
    t.ws.close()
    t2.ws.close()


def restart(d):
    return Daemon(extra_args=d.extra_args, data_dir=d.data_dir).start()


@pytest.mark.fresh_daemon  # stops the daemon
def test_a_graceful_daemon_stop_ends_terminals_but_not_sandboxes(daemon, sandbox):
    t = shell(daemon, sandbox)
    run(t, "setsid sleep 337 & echo st''arted", "started\r\n")
    daemon.stop()
    assert t.wait_control("exit")["reason"] == "cancelled"
    d2 = restart(daemon)
    d2.created |= daemon.created
    try:
        assert wait_no_procs(d2, sandbox, "^sleep 337|^/bin/bash -l") == []
        assert d2.exec(sandbox, "echo alive")["stdout"] == "alive\n"
    finally:
        d2.cleanup()


def test_the_guest_ends_terminals_whose_daemon_died(quick_idle):
    # The host's idle clock died with the daemon; the agent's backstop
    # (idle timeout + 30 s) still ends the terminal and what it started.
    d = quick_idle
    sid = d.create(ttl_seconds=300)
    t = shell(d, sid)
    run(t, "setsid sleep 338 & echo st''arted", "started\r\n")
    d.crash()
    t.ws.shutdown()
    d2 = restart(d)
    d2.created |= d.created
    try:
        assert len(procs(d2, sid, "^sleep 338")) == 1
        assert wait_no_procs(d2, sid, "^sleep 338|^/bin/bash -l", timeout=45) == []
    finally:
        d2.cleanup()
