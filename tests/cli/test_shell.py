"""`hatchery shell`: line-based (no PTY yet), driven through a pipe."""


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
