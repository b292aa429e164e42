"""`hatchery shell`: line-based when stdin is a pipe, a real terminal in
the sandbox when stdin is a terminal (driven here through a local pty)."""

import fcntl
import os
import select
import struct
import subprocess
import termios
import time

from cli import HATCHERY


def test_lines_run_in_order_and_the_directory_carries_over(hx, sbx):
    script = "cd /tmp\npwd\necho hi > here.txt\nls here.txt\necho to-stderr >&2\n\ncd /nonexistent\npwd\nexit\necho never\n"
    p = hx("shell", sbx, input=script, check=0)
    assert p.stdout == "/tmp\nhere.txt\n/tmp\n", p.stdout
    assert "to-stderr" in p.stderr and "can't cd" in p.stderr
    assert "HXCWD" not in p.stderr and "\x1e" not in p.stderr
    assert hx("exec", sbx, "--", "cat /tmp/here.txt", check=0).stdout == "hi\n"


def test_status_is_the_last_commands(hx, sbx):
    assert hx("shell", sbx, input="true\nexit_code() { return 7; }; exit_code\n").returncode == 7
    assert hx("shell", sbx, input="false\ntrue\n").returncode == 0
    assert hx("shell", "--cwd", "/etc", sbx, input="pwd\n", check=0).stdout == "/etc\n"


def test_unknown_sandbox(hx):
    p = hx("shell", "sbx_0000000000000000", input="echo hi\n")
    assert p.returncode == 1 and "no sandbox sbx_0000000000000000" in p.stderr


# On a terminal: a real one in the sandbox. The test is the terminal: it
# holds the master of a local pty whose slave is the CLI's controlling tty.

def _pty_shell(hx, *args, cols=100, rows=30):
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    p = subprocess.Popen([HATCHERY, "shell", *args], stdin=slave, stdout=slave, stderr=slave, env=hx.env,
                         start_new_session=True,
                         preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))
    os.close(slave)
    return p, master


class _Screen:
    def __init__(self, fd):
        self.fd, self.out = fd, b""

    def read_until(self, needle, start=0, timeout=20):
        needle = needle.encode()
        deadline = time.time() + timeout
        while self.out.find(needle, start) < 0:
            left = deadline - time.time()
            assert left > 0, f"{needle!r} not seen; output: {self.out[-1500:]!r}"
            if select.select([self.fd], [], [], min(left, 0.5))[0]:
                try:
                    chunk = os.read(self.fd, 65536)
                except OSError:  # EIO: the CLI is gone
                    chunk = b""
                if not chunk:
                    assert self.out.find(needle, start) >= 0, f"{needle!r} not seen before EOF: {self.out[-1500:]!r}"
                    break
                self.out += chunk
        return self.out.find(needle, start) + len(needle)

    def type(self, s):
        os.write(self.fd, s.encode())

    def mark(self):
        return len(self.out)


def test_on_a_terminal_it_is_a_real_terminal(hx, sbx):
    p, master = _pty_shell(hx, sbx)
    try:
        before = termios.tcgetattr(master)
        s = _Screen(master)
        s.read_until("root@sandbox:")
        # Our terminal went raw: the sandbox's terminal echoes, not ours.
        assert not termios.tcgetattr(master)[3] & termios.ECHO
        m = s.mark()
        s.type("echo hi; stty size\r")
        s.read_until("\rhi\r\n30 100\r\n", start=m)
        # A window change here reaches the sandbox (SIGWINCH -> resize).
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        time.sleep(0.5)
        m = s.mark()
        s.type("stty size\r")
        s.read_until("40 120\r\n", start=m)
        # Ctrl-C goes to the sandbox and interrupts its foreground job, not us.
        m = s.mark()
        s.type("sleep 100\r")
        s.read_until("sleep 100\r\n", start=m)
        time.sleep(0.5)
        t0 = time.time()
        s.type("\x03")
        s.read_until("root@sandbox:", start=m + 12, timeout=5)
        assert time.time() - t0 < 3 and p.poll() is None
        m = s.mark()
        s.type("echo $?\r")
        s.read_until("130\r\n", start=m)
        s.type("exit 5\r")
        assert p.wait(20) == 5
        # And our terminal is as it was.
        assert termios.tcgetattr(master) == before
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        os.close(master)


def test_on_a_terminal_a_program_and_a_directory(hx, sbx):
    p, master = _pty_shell(hx, "--cwd", "/tmp", sbx, "--", "python3", "-c",
                           "import os; print('at', os.getcwd(), os.isatty(0)); raise SystemExit(3)")
    try:
        _Screen(master).read_until("at /tmp True")
        assert p.wait(20) == 3
    finally:
        if p.poll() is None:
            p.kill()
        os.close(master)
    # A program needs a terminal.
    r = hx("shell", sbx, "--", "top", input="")
    assert r.returncode == 1 and "needs a terminal" in r.stderr


def test_on_a_terminal_an_unknown_sandbox(hx):
    p, master = _pty_shell(hx, "sbx_0000000000000000")
    try:
        out = _Screen(master)
        out.read_until("no sandbox sbx_0000000000000000")
        assert p.wait(20) == 1
    finally:
        os.close(master)
