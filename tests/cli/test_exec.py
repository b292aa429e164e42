"""`hatchery exec`: live streaming, the right file descriptors, exit codes
(the command's, 128+N for a signal, 124 for a timeout, 125 for hatchery's
own failures), and the request options."""

import json
import signal
import subprocess
import time

from cli import HATCHERY
from harness import wait_for


def test_streams_output_as_it_is_produced(hx, sbx):
    p = hx.popen("exec", sbx, "--", "echo first; sleep 3; echo second", stdout=subprocess.PIPE)
    start = time.time()
    first = p.stdout.readline()
    got_first = time.time()
    rest = p.stdout.read()
    assert p.wait(30) == 0
    done = time.time()
    assert (first, rest) == ("first\n", "second\n")
    # The first line arrived while the command was still sleeping.
    assert done - got_first >= 2.0, (got_first - start, done - start)


def test_stdout_and_stderr_go_to_their_own_fds_and_the_status_is_the_commands(hx, sbx):
    p = hx("exec", sbx, "--", "echo out; echo err >&2; echo out2; exit 3")
    assert (p.returncode, p.stdout, p.stderr) == (3, "out\nout2\n", "err\n")
    assert hx("exec", sbx, "--", "true").returncode == 0


def test_signal_death_is_128_plus_n(hx, sbx):
    assert hx("exec", sbx, "--", "kill -TERM $$").returncode == 128 + 15
    assert hx("exec", sbx, "--", "kill -KILL $$").returncode == 128 + 9


def test_timeout_has_its_own_status_and_message(hx, sbx):
    start = time.time()
    p = hx("exec", sbx, "--timeout", "1", "--", "echo started; sleep 30")
    assert p.returncode == 124, p
    assert p.stdout == "started\n"
    assert "timed out" in p.stderr and "exit 124" in p.stderr
    assert time.time() - start < 15


def test_argv_shell_cwd_env_and_stdin(hx, sbx):
    # Several arguments: an argv, no shell, spaces kept.
    assert hx("exec", sbx, "--", "printf", "%s|", "a b", "$HOME", check=0).stdout == "a b|$HOME|"
    # One argument: a shell command line.
    assert hx("exec", sbx, "--", "echo $((6*7)) | tr 4 X", check=0).stdout == "X2\n"
    assert hx("exec", sbx, "--cwd", "/tmp", "--", "pwd", check=0).stdout == "/tmp\n"
    out = hx("exec", sbx, "-e", "A=1", "--env", "B=x=y", "--", "echo $A $B", check=0).stdout
    assert out == "1 x=y\n"
    assert hx("exec", sbx, "-i", "--", "wc -l", input="a\nb\nc\n", check=0).stdout.strip() == "3"
    # Without -i the command's stdin is empty, not ours.
    assert hx("exec", sbx, "--", "cat", input="ignored", check=0).stdout == ""
    # Flags after the id but before the command still count as ours.
    assert hx("exec", sbx, "-t", "5", "ls", "-d", "/tmp", check=0).stdout == "/tmp\n"


def test_json_result_and_truncation_note(hx, sbx):
    p = hx("exec", sbx, "--json", "--", "echo hi; exit 5")
    assert p.returncode == 5
    r = json.loads(p.stdout)
    assert (r["stdout"], r["exit_code"], r["timed_out"]) == ("hi\n", 5, False)
    # A stream past the cap ends the command (killed: 137), and stderr says why.
    p = hx("exec", sbx, "--max-output-bytes", "10", "--", "head -c 1000 /dev/zero | tr '\\0' a; sleep 30")
    assert p.returncode == 137 and p.stdout == "a" * 10, p
    assert "output_limit" in p.stderr and "--max-output-bytes" in p.stderr, p.stderr


def test_cpu_limit_stops_the_command_and_says_so(hx, sbx):
    start = time.time()
    p = hx("exec", sbx, "--cpu-limit-ms", "300", "--", "python3 -c 'while True: pass'")
    assert p.returncode == 137, p
    assert "cpu_limit" in p.stderr and "CPU" in p.stderr, p.stderr
    assert time.time() - start < 20
    # Under the limit nothing happens; --json shows the reason.
    p = hx("exec", sbx, "--cpu-limit-ms", "5000", "--json", "--", "echo fine")
    r = json.loads(p.stdout)
    assert (p.returncode, r["reason"], r["stdout"]) == (0, "exited", "fine\n"), p
    p = hx("exec", sbx, "--json", "--cpu-limit-ms", "300", "--", "python3 -c 'while True: pass'")
    r = json.loads(p.stdout)
    assert p.returncode == 137 and r["reason"] == "cpu_limit" and r["cpu_ms"] >= 300, r
    assert p.stderr == "", "--json prints no notes"
    # More CPU than the deadline allows is the request's fault: 125.
    p = hx("exec", sbx, "--timeout", "1", "--cpu-limit-ms", "5000", "--", "true")
    assert p.returncode == 125 and "cpu_limit_ms" in p.stderr, p


def test_failures_of_hatchery_itself_exit_125(hx, sbx):
    p = hx("exec", "sbx_0000000000000000", "--", "true")
    assert p.returncode == 125 and "no sandbox sbx_0000000000000000" in p.stderr
    p = hx("exec", sbx, "--cwd", "/does-not-exist", "--", "true")
    assert p.returncode == 125 and "/does-not-exist" in p.stderr
    p = hx("exec", sbx, "--timeout", "0", "--", "true")
    assert p.returncode == 125 and "invalid_request" in p.stderr
    p = hx("exec", sbx, "-e", "NOEQUALS", "--", "true")
    assert p.returncode == 125 and "KEY=VALUE" in p.stderr
    # A missing program is the command's failure, as in a shell.
    p = hx("exec", sbx, "--", "no-such-program", "x")
    assert p.returncode == 127
    # No command at all is a usage error.
    assert hx("exec", sbx).returncode == 2


def test_ctrl_c_kills_the_remote_command(hx, sbx):
    p = hx.popen("exec", sbx, "--", "echo $$ > /tmp/pid; echo started; sleep 60; touch /tmp/finished",
                 stdout=subprocess.PIPE)
    assert p.stdout.readline() == "started\n"
    p.send_signal(signal.SIGINT)
    assert p.wait(10) != 0
    # Closing the stream kills the command in the sandbox.
    wait_for(lambda: hx("exec", sbx, "--", "kill -0 $(cat /tmp/pid)").returncode != 0, timeout=10,
             what="the remote command to die")
    assert hx("exec", sbx, "--", "test -e /tmp/finished").returncode == 1


def test_a_closed_pipe_ends_quietly(hx, sbx):
    p = subprocess.run(f"{HATCHERY} exec {sbx} -- 'seq 1 100000; sleep 30' | head -1", shell=True,
                       capture_output=True, text=True, env=hx.env, timeout=30)
    assert p.stdout == "1\n" and "panicked" not in p.stderr, p.stderr
