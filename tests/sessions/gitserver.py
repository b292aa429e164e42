"""A real git server for the tests: `git daemon` on loopback serving
bare repositories made in a temporary directory."""

import os
import shutil
import socket
import subprocess
import tempfile
import time

GIT_ENV = dict(os.environ, GIT_CONFIG_GLOBAL="/dev/null", GIT_CONFIG_NOSYSTEM="1",
               GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.invalid",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.invalid")


def git(*args, cwd=None):
    subprocess.run(["git", *args], cwd=cwd, env=GIT_ENV, check=True, capture_output=True)


class GitServer:
    def __init__(self, host="127.0.0.1"):
        self.root = tempfile.mkdtemp(prefix="hxgit-")
        self.host = host
        s = socket.socket()
        s.bind((host, 0))
        self.port = s.getsockname()[1]
        s.close()
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(
            ["git", "daemon", "--reuseaddr", "--export-all", f"--listen={self.host}", f"--port={self.port}",
             f"--base-path={self.root}", self.root],
            env=GIT_ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                socket.create_connection((self.host, self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("git daemon did not start")

    def add_repo(self, name, files, branch="main"):
        """A bare repo `name.git` with one commit of `files` on `branch`."""
        work = tempfile.mkdtemp(prefix="hxgitw-")
        git("init", "-q", "-b", branch, cwd=work)
        for path, content in files.items():
            p = os.path.join(work, path)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w") as f:
                f.write(content)
        git("add", ".", cwd=work)
        git("commit", "-q", "-m", "initial", cwd=work)
        bare = os.path.join(self.root, name + ".git")
        git("clone", "-q", "--bare", work, bare)
        shutil.rmtree(work, ignore_errors=True)
        return f"git://{self.host}:{self.port}/{name}.git"

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)
