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


# --- run --code: the sandbox's interpreter (run_code) -------------------------

def test_code_prints_output_and_results_and_cleans_up(hx, daemon, tmp_path):
    from harness import metric
    runs = metric(daemon, "hatchery_code_runs_total")
    cell = tmp_path / "cell.py"
    cell.write_text("import os, sys\nprint('out', os.getcwd(), os.environ.get('MODE'))\n"
                    "print('err', file=sys.stderr)\ndisplay('shown')\n6 * 7\n")
    p = hx("run", "-e", "MODE=x", "--code", str(cell))
    assert p.returncode == 0, p
    # stdout as printed, then each result's text/plain.
    assert p.stdout == "out /workspace x\n'shown'\n42\n", p.stdout
    assert p.stderr == "err\n", p.stderr
    assert metric(daemon, "hatchery_code_runs_total") >= runs + 1, "ran through run_code"
    assert hx.live() == []


def test_code_from_stdin(hx):
    p = hx("run", "--code", "-", input="x = [i * i for i in range(5)]\nprint(sum(x))\n")
    assert (p.returncode, p.stdout) == (0, "30\n"), p
    assert hx.live() == []


def test_code_exception_exits_1_with_the_traceback_on_stderr(hx, tmp_path):
    cell = tmp_path / "boom.py"
    cell.write_text("print('before')\ndef f():\n    return {}['missing']\nf()\nprint('after')\n")
    p = hx("run", "--code", str(cell))
    assert p.returncode == 1, p
    assert p.stdout == "before\n"
    assert p.stderr.startswith("Traceback (most recent call last):"), p.stderr
    assert "KeyError: 'missing'" in p.stderr and "line 3, in f" in p.stderr, p.stderr
    # sys.exit behaves as it does under python3: its status, no traceback.
    p = hx("run", "--code", "-", input="import sys\nprint('bye')\nsys.exit(3)\n")
    assert (p.returncode, p.stdout, p.stderr) == (3, "bye\n", ""), p
    # A syntax error is an exception too.
    p = hx("run", "--code", "-", input="def (:\n")
    assert p.returncode == 1 and "SyntaxError" in p.stderr, p
    assert hx.live() == []


def test_code_timeout_is_124_and_cleans_up(hx):
    start = time.time()
    p = hx("run", "--timeout", "2", "--code", "-",
           input="import time\nprint('going', flush=True)\ntime.sleep(60)\n")
    assert p.returncode == 124, p
    assert p.stdout == "going\n" and "timed out" in p.stderr, p
    assert time.time() - start < 20
    assert hx.live() == []


def test_code_cpu_limit_and_hatchery_failures(hx):
    p = hx("run", "--cpu-limit-ms", "300", "--code", "-", input="while True:\n    pass\n")
    assert p.returncode == 137 and "cpu_limit" in p.stderr, p
    # Hatchery's own failures are 125; nothing is left behind either way.
    p = hx("run", "--template", "no-such-template", "--code", "-", input="print(1)\n")
    assert p.returncode == 125 and "template_not_found" in p.stderr, p
    p = hx("run", "--code", "/nonexistent/cell.py")
    assert p.returncode == 125 and "reading" in p.stderr, p
    p = hx("run", "--timeout", "2", "--cpu-limit-ms", "5000", "--code", "-", input="print(1)\n")
    assert p.returncode == 125 and "cpu_limit_ms" in p.stderr, p
    # --code and a FILE, or --code and program arguments, do not mix.
    assert hx("run", "--code", "-", "x.py", input="").returncode == 2
    assert hx("run", "--code", "-", "--", "arg", input="").returncode == 2
    assert hx.live() == []


def test_code_ctrl_c_destroys_the_sandbox(hx):
    p = hx.popen("run", "--code", "-", stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdin.write("import time\nprint('started', flush=True)\ntime.sleep(120)\n")
    p.stdin.close()
    assert p.stdout.readline() == "started\n"
    running = hx.live()
    assert len(running) == 1
    p.send_signal(signal.SIGINT)
    rc = p.wait(30)
    err = p.stderr.read()
    assert rc == 130, (rc, err)
    assert f"destroyed sandbox {running[0]}" in err
    assert hx.live() == []
