"""`e2b-code-interpreter` (the official Python SDK) against a live daemon:
the behaviours of E2B's code-interpreter server that its SDK and its own
test suite rely on (issue 35): contexts in /home/user, one stdout message
per print, new contexts listed last, `!` shell lines, a run the client gave
up on stopped so the next one runs, and a run whose sandbox is killed
raising instead of returning."""

import json
import threading
import time

import pytest
from e2b import TimeoutException


@pytest.fixture
def ci(daemon):
    from e2b_code_interpreter import Sandbox
    s = Sandbox.create(timeout=300)  # code-interpreter-v1: a template with no user `user`
    yield s
    s.kill()


def test_contexts_work_in_home_user_as_e2b(ci):
    # The default context moves there before its first run; a new one starts there.
    assert "".join(ci.run_code("from pathlib import Path; print(Path.cwd())").logs.stdout) == "/home/user\n"
    ctx = ci.create_code_context()
    assert ctx.cwd == "/home/user"
    assert ci.run_code("import os; os.getcwd()", context=ctx).text == "/home/user"
    # A cwd given is used as given (and must exist).
    other = ci.create_code_context(cwd="/tmp")
    assert ci.run_code("import os; os.getcwd()", context=other).text == "/tmp"
    # The default context stays where the user moves it: placed once only.
    ci.run_code("import os; os.chdir('/tmp')")
    assert ci.run_code("os.getcwd()").text == "/tmp"
    default = [c for c in ci.list_code_contexts() if c.id == "default"][0]
    assert default.cwd == "/home/user"


def test_a_string_result_reads_without_quotes_as_e2b(ci):
    # E2B's server drops the quotes of a str's repr from `text` (so
    # `os.getenv(...)` reads as the value); only a pair around the whole.
    assert ci.run_code("import os; os.getenv('FOO')", envs={"FOO": "bar"}).text == "bar"
    assert ci.run_code('"x"').text == "x"
    assert ci.run_code("['a', 'b']").text == "['a', 'b']"
    assert ci.run_code("''").text == ""


def test_an_indented_cell_runs_as_in_ipython(ci):
    # E2B's own tests send cells from indented triple-quoted strings.
    ex = ci.run_code("""
        x = 20
        if x:
            x += 1
        x * 2
        """)
    assert ex.error is None and ex.text == "42"


def test_display_raw_shows_only_the_given_formats(ci):
    ex = ci.run_code("display({'text/latex': r'\\text{CustomReprObject}'}, raw=True)")
    assert ex.results[0].formats() == ["latex"] and ex.results[0].text is None


def test_each_print_is_one_stdout_message(ci):
    out, err = [], []
    ex = ci.run_code("import sys\nprint(1)\nprint('a', 'b')\nprint('e', file=sys.stderr)\nprint('x', end='')",
                     on_stdout=lambda m: out.append(m.line), on_stderr=lambda m: err.append(m.line))
    assert out == ["1\n", "a b\n", "x"]
    assert ex.logs.stdout == ["1\n", "a b\n", "x"]
    assert err == ["e\n"] and ex.logs.stderr == ["e\n"]


def test_a_new_context_is_listed_last(ci):
    made = [ci.create_code_context() for _ in range(4)]
    listed = ci.list_code_contexts()
    assert listed[0].id == "default"
    assert [c.id for c in listed[-4:]] == [c.id for c in made]
    ci.remove_code_context(made[1])
    assert [c.id for c in ci.list_code_contexts()[-3:]] == [made[0].id, made[2].id, made[3].id]


def test_shell_escapes_as_ipython(ci):
    ex = ci.run_code("!pwd")
    assert "".join(ex.logs.stdout).strip() == "/home/user"
    ex = ci.run_code("n = 3\nlines = !seq $n\nprint(lines)\n!echo {n * 2} $HOME; exit 4\n_exit_code")
    assert "".join(ex.logs.stdout) == "['1', '2', '3']\n6 /root\n" and ex.text == "4"
    # A `!` that is Python (an expression, a string) is left alone.
    assert ci.run_code("x = not 1 != 2\ns = '''\n!pwd\n'''\ns").text == "\\n!pwd\\n"


def test_the_run_after_a_client_timeout_runs(ci):
    with pytest.raises(TimeoutException):
        ci.run_code("import time; time.sleep(300)", timeout=3)
    t0 = time.monotonic()
    # The abandoned run is stopped (its interpreter restarted), so this one
    # does not wait behind it.
    assert ci.run_code("1 + 1", timeout=15).text == "2"
    assert time.monotonic() - t0 < 15


def test_run_code_raises_when_the_sandbox_is_killed_mid_run(ci):
    timer = threading.Timer(2.0, ci.kill)
    timer.start()
    try:
        with pytest.raises(TimeoutException, match="sandbox was killed while the request was in progress"):
            ci.run_code("import time; time.sleep(300)", timeout=120)
    finally:
        timer.cancel()


def test_bash_runs_and_contexts(ci):
    ex = ci.run_code("pwd; X=5", language="bash")
    assert ex.logs.stdout == ["/home/user\n"] and ex.error is None
    # The default bash context keeps its state, apart from Python's.
    assert ci.run_code("echo $((X * 2))", language="bash").logs.stdout == ["10\n"]
    assert ci.run_code("echo $FOO", envs={"FOO": "bar"}, language="bash").logs.stdout == ["bar\n"]
    assert ci.run_code("echo ${FOO:-default}", language="bash").logs.stdout == ["default\n"]
    ctx = ci.create_code_context(language="bash")
    assert (ctx.language, ctx.cwd) == ("bash", "/home/user")
    assert ci.run_code("echo ${X:-fresh}", context=ctx).logs.stdout == ["fresh\n"]
    assert "bash" in [c.language for c in ci.list_code_contexts()]


def test_other_languages_are_refused_with_a_reason(ci):
    # What the SDK raises (documented in docs/e2b.md).
    from e2b import SandboxException
    for lang in ("rust", "kotlin"):
        with pytest.raises(SandboxException, match="400 Bad Request: .*language .*%s.* is not supported by Hatchery" % lang):
            ci.run_code("1", language=lang)
        with pytest.raises(SandboxException, match="not supported by Hatchery"):
            ci.create_code_context(language=lang)
    # R and Java are supported, but this template has neither
    # (code-interpreter-full has both): 400 with what it lacks.
    for lang, lacks in (("r", "/usr/bin/Rscript"), ("java", "JDK with jshell")):
        with pytest.raises(SandboxException, match="400 Bad Request: .*no %s interpreter in this sandbox: "
                                                   "its template has no %s" % (lang, lacks)):
            ci.run_code("1", language=lang)
        with pytest.raises(SandboxException, match="no %s interpreter in this sandbox" % lang):
            ci.create_code_context(language=lang)
    # JavaScript and TypeScript are supported, but this template has no
    # Node (code-interpreter-full has): 400 with the reason.
    for lang, name in (("js", "javascript"), ("javascript", "javascript"), ("ts", "typescript"),
                       ("typescript", "typescript")):
        with pytest.raises(SandboxException, match="400 Bad Request: .*no %s interpreter in this sandbox: "
                                                   "its template has no /usr/bin/node" % name):
            ci.run_code("1", language=lang)
        with pytest.raises(SandboxException, match="no %s interpreter in this sandbox" % name):
            ci.create_code_context(language=lang)
    # Python still runs after the refusals.
    assert ci.run_code("1 + 1").text == "2"


def test_contexts_need_the_sandbox_s_traffic_token(daemon, ci):
    """E2B serves /contexts publicly; Hatchery wants the traffic token the
    SDK gets at create (and sends there), so knowing an id opens nothing."""
    from test_bad_input import req
    tok = ci.traffic_access_token
    assert tok and tok != ci._envd_access_token
    base = {"E2b-Sandbox-Id": ci.sandbox_id, "E2b-Sandbox-Port": "49999"}
    path = "/e2b/sandbox/contexts"
    assert req(daemon, "GET", path, headers=base)[0] == 401
    assert req(daemon, "GET", path, headers={**base, "E2B-Traffic-Access-Token": "00" * 24})[0] == 401
    s, _, body = req(daemon, "GET", path, headers={**base, "E2B-Traffic-Access-Token": tok})
    assert s == 200 and any(c["id"] == "default" for c in json.loads(body)), body
    # The traffic token opens the contexts only: not /execute, not envd.
    s, _, _ = req(daemon, "POST", "/e2b/sandbox/execute", json.dumps({"code": "1"}),
                  {**base, "E2B-Traffic-Access-Token": tok, "Content-Type": "application/json"})
    assert s == 401
    envd = {"E2b-Sandbox-Id": ci.sandbox_id, "E2B-Traffic-Access-Token": tok}
    assert req(daemon, "GET", "/e2b/sandbox/health", headers=envd)[0] == 401
    # Another sandbox's traffic token is not this one's.
    assert req(daemon, "GET", path, headers={**base, "E2b-Sandbox-Id": ci.sandbox_id + "x",
                                             "E2B-Traffic-Access-Token": tok})[0] == 401
