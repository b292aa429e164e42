"""Background processes: `exec --background`, `ps`, `attach`, `wait`, `kill`.
Like `exec`, `attach` and `wait` exit with the process's status and with
125 for hatchery's own failures."""

import json
import re
import signal
import subprocess
import time

from cli import HATCHERY
from harness import wait_for

PROC_ID = re.compile(r"proc_[0-9a-f]{16}")


def start(hx, sbx, *cmd):
    p = hx("exec", "--background", sbx, "--", *cmd, check=0)
    pid = p.stdout.strip()
    assert PROC_ID.fullmatch(pid), p
    return pid


def info(hx, sbx, pid):
    return next(p for p in json.loads(hx("ps", sbx, "--json", check=0).stdout) if p["id"] == pid)


def test_background_start_ps_and_attach_from_the_start(hx, sbx):
    t0 = time.time()
    pid = start(hx, sbx, "for i in 1 2 3; do echo line$i; sleep 1; done; echo err >&2; exit 7")
    # It returned at once, with the process still running.
    assert time.time() - t0 < 5
    ps = hx("ps", sbx, check=0).stdout.splitlines()
    assert ps[0].split() == ["ID", "PID", "STATE", "EXIT", "CPU", "ms", "STARTED", "COMMAND"], ps
    row = next(l for l in ps if l.startswith(pid))
    assert "running" in row and "for i in 1 2 3" in row, row
    listed = json.loads(hx("ps", sbx, "--json", check=0).stdout)
    assert [p["id"] for p in listed] == [pid] and listed[0]["state"] == "running"
    p = hx("attach", sbx, pid, "--from-start", "--no-stdin")
    assert (p.returncode, p.stdout, p.stderr) == (7, "line1\nline2\nline3\n", "err\n"), p
    # Once it has exited: ps shows its status, a late attach replays and exits the same.
    row = next(l for l in hx("ps", sbx, check=0).stdout.splitlines() if l.startswith(pid))
    assert re.search(r"exited\s+7\s", row), row
    p = hx("attach", sbx, pid, "--from-start", "--no-follow", "--no-stdin")
    assert (p.returncode, p.stdout) == (7, "line1\nline2\nline3\n"), p
    # --json gives the ProcessInfo.
    full = json.loads(hx("exec", "--background", "--json", sbx, "--", "true", check=0).stdout)
    assert PROC_ID.fullmatch(full["id"]) and full["argv"] == ["/bin/sh", "-c", "true"]
    assert hx("wait", sbx, full["id"], "--timeout", "30").returncode == 0


def test_attach_output_is_byte_exact_and_offsets(hx, sbx):
    pid = start(hx, sbx, "printf 'a\\377\\000b\\n'; printf 'tail\\n'")
    assert hx("wait", sbx, pid, "-t", "30").returncode == 0
    p = subprocess.run([HATCHERY, "attach", sbx, pid, "--from-start", "--no-stdin"], capture_output=True,
                       env=hx.env, timeout=60)
    assert (p.returncode, p.stdout) == (0, b"a\xff\x00b\ntail\n"), p
    p = hx("attach", sbx, pid, "--offset", "5", "--no-stdin")
    assert (p.returncode, p.stdout) == (0, "tail\n"), p


def test_attach_forwards_piped_stdin_and_closes_it(hx, sbx):
    pid = start(hx, sbx, 'while read l; do echo "got $l"; done; echo eof')
    p = subprocess.run(f"printf 'a\\nb\\n' | {HATCHERY} attach {sbx} {pid} --from-start --stdin",
                       shell=True, capture_output=True, text=True, env=hx.env, timeout=60)
    assert (p.returncode, p.stdout) == (0, "got a\ngot b\neof\n"), p


def test_ctrl_c_detaches_and_leaves_it_running(hx, sbx):
    pid = start(hx, sbx, "echo hello; sleep 300")
    p = hx.popen("attach", sbx, pid, "--from-start", "--no-stdin", stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE)
    assert p.stdout.readline() == "hello\n"
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 130 and "detached" in err and f"hatchery kill {sbx} {pid}" in err, err
    assert info(hx, sbx, pid)["state"] == "running"
    assert hx("kill", sbx, pid, check=0).stdout.strip() == pid


def test_kill_ends_the_process_tree(hx, sbx):
    pid = start(hx, sbx, "sleep 300 & sleep 300 & wait")
    wait_for(lambda: hx("exec", sbx, "--", "pgrep -c -x sleep").stdout.strip() == "2", what="sleeps")
    assert hx("kill", sbx, pid, check=0).stdout.strip() == pid
    got = info(hx, sbx, pid)
    assert got["state"] == "exited" and got["reason"] == "cancelled", got
    wait_for(lambda: hx("exec", sbx, "--", "pgrep -c -x sleep").stdout.strip() == "0", what="no sleeps")
    assert hx("wait", sbx, pid, "-t", "5").returncode == 128 + 9


def test_kill_signal_term_runs_the_trap(hx, sbx):
    pid = start(hx, sbx, "trap 'echo trapped; exit 42' TERM; echo ready; while true; do sleep 0.2; done")
    wait_for(lambda: info(hx, sbx, pid)["output_bytes"] > 0, what="ready")
    assert hx("kill", sbx, pid, "--signal", "TERM", check=0).stdout.strip() == pid
    assert hx("wait", sbx, pid, "--timeout", "30").returncode == 42
    p = hx("attach", sbx, pid, "--from-start", "--no-stdin")
    assert (p.returncode, p.stdout) == (42, "ready\ntrapped\n"), p
    p = hx("kill", sbx, pid, "--signal", "BOGUS")
    assert p.returncode == 1 and "BOGUS" in p.stderr, p


def test_wait_timeout_is_124(hx, sbx):
    pid = start(hx, sbx, "sleep 300")
    t0 = time.time()
    p = hx("wait", sbx, pid, "--timeout", "2")
    assert p.returncode == 124 and "still running" in p.stderr, p
    assert 1.5 < time.time() - t0 < 20
    p = hx("wait", sbx, pid, "--timeout", "1", "--json")
    assert p.returncode == 124 and json.loads(p.stdout)["state"] == "running", p
    hx("kill", sbx, pid, check=0)


def test_another_sandboxs_process_is_a_clear_error(hx, sbx):
    other = hx.create("--ttl", "600")
    try:
        pid = start(hx, other, "sleep 300")
        for args, code in ((["attach", "--no-stdin"], 125), (["wait"], 125), (["kill"], 1)):
            p = hx(args[0], sbx, pid, *args[1:])
            assert p.returncode == code, (args, p)
            assert f"no process {pid} in sandbox {sbx}" in p.stderr and f"hatchery ps {sbx}" in p.stderr, p
        # Still running where it belongs; wrong kinds of id are caught here.
        assert info(hx, other, pid)["state"] == "running"
        p = hx("attach", sbx, "sbx_0000000000000000")
        assert p.returncode == 125 and "not a process id" in p.stderr, p
        p = hx("ps", "sbx_0000000000000000")
        assert p.returncode == 1 and "no sandbox sbx_0000000000000000" in p.stderr, p
    finally:
        hx("sandbox", "kill", other)
