"""`hatchery run FILE`: a fresh sandbox per run, gone afterwards whether the
program succeeds, fails, times out or we are interrupted."""

import signal
import subprocess
import time

from harness import wait_for


def test_runs_the_file_with_args_and_cleans_up(hx, tmp_path):
    prog = tmp_path / "hello.py"
    prog.write_text("import os, sys\nprint('args', sys.argv[1:], os.getcwd(), os.environ.get('MODE'))\n"
                    "print('warn', file=sys.stderr)\nsys.exit(4)\n")
    p = hx("run", "-e", "MODE=test", str(prog), "--", "a", "b c")
    assert p.returncode == 4, p
    assert p.stdout == "args ['a', 'b c'] /workspace test\n"
    assert p.stderr == "warn\n"
    assert hx.live() == []


def test_shell_scripts_stdin_and_interpreter(hx, tmp_path):
    sh = tmp_path / "count.sh"
    sh.write_text("wc -w\n")
    assert hx("run", "-i", str(sh), input="one two three\n", check=0).stdout.strip() == "3"
    other = tmp_path / "prog.txt"
    other.write_text("print(2 + 2)\n")
    p = hx("run", str(other))
    assert p.returncode == 125 and "--interpreter" in p.stderr
    assert hx("run", "--interpreter", "python3", str(other), check=0).stdout == "4\n"
    assert hx.live() == []


def test_errors_and_timeouts_still_clean_up(hx, tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def (:\n")
    p = hx("run", str(bad))
    assert p.returncode == 1 and "SyntaxError" in p.stderr
    slow = tmp_path / "slow.py"
    slow.write_text("import time\nprint('going', flush=True)\ntime.sleep(60)\n")
    p = hx("run", "--timeout", "2", str(slow))
    assert p.returncode == 124 and p.stdout == "going\n" and "timed out" in p.stderr
    p = hx("run", "--template", "no-such-template", str(slow))
    assert p.returncode == 125 and "template_not_found" in p.stderr
    p = hx("run", str(tmp_path / "missing.py"))
    assert p.returncode == 125 and "reading" in p.stderr
    assert hx.live() == []


def interrupt(hx, tmp_path, sig):
    slow = tmp_path / "slow.py"
    slow.write_text("import time\nprint('started', flush=True)\ntime.sleep(120)\n")
    p = hx.popen("run", str(slow), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout.readline() == "started\n"
    running = hx.live()
    assert len(running) == 1
    start = time.time()
    p.send_signal(sig)
    rc = p.wait(30)
    err = p.stderr.read()
    assert rc == 128 + sig, (rc, err)
    assert f"destroyed sandbox {running[0]}" in err
    assert hx.live() == []
    assert time.time() - start < 10


def test_ctrl_c_destroys_the_sandbox(hx, tmp_path):
    interrupt(hx, tmp_path, signal.SIGINT)


def test_sigterm_destroys_the_sandbox(hx, tmp_path):
    interrupt(hx, tmp_path, signal.SIGTERM)


def test_interrupt_during_create_does_not_leak(hx, tmp_path):
    prog = tmp_path / "p.py"
    prog.write_text("import time\ntime.sleep(60)\n")
    p = hx.popen("run", str(prog), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # As early as we can: the create may be in flight.
    time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    # 130: our handler ran; -2: the signal beat it, before any request.
    assert p.wait(60) in (130, -2), p.stderr.read()
    wait_for(lambda: hx.live() == [], timeout=10, what="no sandbox after an early Ctrl-C")
