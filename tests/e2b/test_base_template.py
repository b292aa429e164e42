"""`base` as E2B's base (issue 35): git, curl, pip and sudo with a
passwordless rule for `user` (which this host's runsc does not let take
effect, below), and the Python SDK's git helpers on it (`sandbox.git`, which
runs git in the sandbox through `commands.run`). Nothing leaves the sandbox: the
remotes are bare repositories in it, served over file:// and git://127.0.0.1,
and curl fetches from a server on the sandbox's own loopback."""

import pytest

from e2b import CommandExitException


def run(sbx, cmd, **kw):
    r = sbx.commands.run(cmd, **kw)
    assert r.exit_code == 0, (cmd, r.stderr)
    return r.stdout


def test_tools_on_path(sbx):
    out = run(sbx, "for t in git curl sudo pip3 python3 bash; do command -v $t; done")
    assert out.split() == ["/usr/bin/git", "/usr/bin/curl", "/usr/bin/sudo", "/usr/bin/pip3",
                           "/usr/bin/python3", "/usr/bin/bash"]
    assert run(sbx, "git --version").startswith("git version 2.")
    # CA certificates for HTTPS clients (curl, git, pip) when egress allows it.
    assert run(sbx, "test -s /etc/ssl/certs/ca-certificates.crt && echo ok").strip() == "ok"


def test_sudo(sbx):
    assert run(sbx, "whoami").strip() == "user"
    # The rule the template's setup wrote: root's, 0440, and sudo reads it.
    assert run(sbx, "stat -c '%U %a' /etc/sudoers.d/user", user="root").strip() == "root 440"
    assert "(ALL : ALL) NOPASSWD: ALL" in run(sbx, "sudo -n -l -U user", user="root")
    assert run(sbx, "sudo -n whoami", user="root").strip() == "root"
    # As `user` it takes setuid, which runsc 0.0~20240729 does not honour:
    # it ignores setuid bits and holds every process to no_new_privs
    # (prctl(PR_GET_NO_NEW_PRIVS) is 1 even for root; gVisor issue 212), so
    # sudo refuses and says why. A runsc that honours them (`--allow-suid`,
    # with noNewPrivileges off in oci.rs) reports 0, and then sudo must work.
    nnp = run(sbx, "python3 -c 'import ctypes; print(ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))'").strip()
    out = run(sbx, "sudo -n whoami 2>&1; echo rc=$?")
    if nnp == "0":
        assert out == "root\nrc=0\n"
    else:
        assert nnp == "1"
        assert 'The "no new privileges" flag is set' in out and out.endswith("rc=1\n"), out


def test_curl_on_loopback(sbx):
    run(sbx, "mkdir -p /tmp/www && echo served > /tmp/www/f.txt")
    srv = sbx.commands.run("cd /tmp/www && exec python3 -m http.server 18080 --bind 127.0.0.1", background=True)
    try:
        out = run(sbx, "for i in $(seq 50); do curl -fsS http://127.0.0.1:18080/f.txt && exit 0; sleep 0.1; done; "
                       "exit 1")
        assert out == "served\n"
    finally:
        srv.kill()


def test_git_helpers(sbx):
    git = sbx.git
    repo = "/home/user/repo"
    git.init(repo, initial_branch="main")
    git.configure_user("Sandbox Bot", "bot@example.com")
    assert git.get_config("user.name") == "Sandbox Bot"
    git.set_config("core.autocrlf", "false", scope="local", path=repo)
    assert git.get_config("core.autocrlf", scope="local", path=repo) == "false"

    sbx.files.write(f"{repo}/README.md", "hello\n")
    st = git.status(repo)
    assert st.current_branch == "main"
    assert [(f.name, f.status, f.staged) for f in st.file_status] == [("README.md", "untracked", False)]
    git.add(repo)
    st = git.status(repo)
    assert [(f.name, f.status, f.staged) for f in st.file_status] == [("README.md", "added", True)]
    git.commit(repo, "first", author_name="Sandbox Bot", author_email="bot@example.com")
    assert git.status(repo).is_clean
    assert run(sbx, f"git -C {repo} log --format='%an <%ae> %s'").strip() == "Sandbox Bot <bot@example.com> first"

    git.create_branch(repo, "feature")
    b = git.branches(repo)
    assert (sorted(b.branches), b.current_branch) == (["feature", "main"], "feature")
    sbx.files.write(f"{repo}/README.md", "changed\n")
    st = git.status(repo)
    assert [(f.name, f.status) for f in st.file_status] == [("README.md", "modified")]
    git.restore(repo, ["README.md"])
    assert sbx.files.read(f"{repo}/README.md") == "hello\n"
    sbx.files.write(f"{repo}/b.txt", "b\n")
    git.add(repo, files=["b.txt"])
    git.reset(repo, paths=["b.txt"])
    assert [(f.name, f.staged) for f in git.status(repo).file_status] == [("b.txt", False)]
    run(sbx, f"rm {repo}/b.txt")
    git.checkout_branch(repo, "main")
    git.delete_branch(repo, "feature")
    assert git.branches(repo).branches == ["main"]
    with pytest.raises(CommandExitException):
        git.checkout_branch(repo, "no-such-branch")


def test_git_clone_push_pull_in_the_sandbox(sbx):
    """A bare repository in the sandbox is the remote: push to it by path,
    clone it over file://, pull a commit made in the clone, and the same
    over git:// from a `git daemon` on the sandbox's loopback (as E2B's own
    git tests do)."""
    git = sbx.git
    git.configure_user("Sandbox Bot", "bot@example.com")
    remote, repo, clone = "/home/user/remote.git", "/home/user/src", "/home/user/clone"
    git.init(remote, bare=True, initial_branch="main")
    git.init(repo, initial_branch="main")
    sbx.files.write(f"{repo}/a.txt", "one\n")
    git.add(repo)
    git.commit(repo, "one")
    git.remote_add(repo, "origin", remote)
    assert git.remote_get(repo, "origin") == remote
    assert git.remote_get(repo, "nope") is None
    git.push(repo, remote="origin", branch="main")
    st = git.status(repo)
    assert (st.upstream, st.ahead, st.behind) == ("origin/main", 0, 0)

    git.clone(f"file://{remote}", clone)
    assert sbx.files.read(f"{clone}/a.txt") == "one\n"
    sbx.files.write(f"{clone}/a.txt", "two\n")
    git.add(clone)
    git.commit(clone, "two")
    git.push(clone)
    git.pull(repo)
    assert sbx.files.read(f"{repo}/a.txt") == "two\n"

    # git:// on the sandbox's loopback, shallow and single-branch.
    d = sbx.commands.run("git daemon --reuseaddr --base-path=/home/user --export-all --listen=127.0.0.1 "
                         "--port=19418", background=True)
    try:
        run(sbx, "for i in $(seq 50); do git ls-remote git://127.0.0.1:19418/remote.git >/dev/null 2>&1 "
                 "&& exit 0; sleep 0.1; done; exit 1")
        git.clone("git://127.0.0.1:19418/remote.git", "/home/user/shallow", branch="main", depth=1)
        assert run(sbx, "git -C /home/user/shallow rev-list --count HEAD").strip() == "1"
        assert sbx.files.read("/home/user/shallow/a.txt") == "two\n"
    finally:
        d.kill()
