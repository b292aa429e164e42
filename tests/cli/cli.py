"""Runs the `hatchery` binary against one daemon (see conftest.py)."""

import os
import re
import signal
import subprocess

from harness import BIN_DIR, KEY

HATCHERY = os.path.join(BIN_DIR, "hatchery")
SBX_ID = re.compile(r"sbx_[a-z0-9]{16}")


class Cli:
    """Runs the binary against one daemon and remembers every sandbox id it
    printed, so the host leak check knows what to look for."""

    def __init__(self, daemon):
        self.d = daemon
        self.env = dict(os.environ, HATCHERY_URL=f"http://127.0.0.1:{daemon.port}",
                        HATCHERY_API_KEY=KEY, HATCHERY_KEY_FILE="/nonexistent")

    def __call__(self, *args, input=None, timeout=120, env=None, check=None):
        p = subprocess.run([HATCHERY, *args], input=input, capture_output=True, timeout=timeout,
                           env=dict(self.env, **(env or {})),
                           text=not isinstance(input, bytes))
        out = p.stdout if isinstance(p.stdout, str) else p.stdout.decode(errors="replace")
        self.d.created.update(SBX_ID.findall(out))
        if check is not None:
            assert p.returncode == check, (args, p.returncode, p.stdout, p.stderr)
        return p

    def popen(self, *args, **kw):
        # SIGINT back to its default: a shell that started this run in the
        # background (`make test &`) passes it down ignored, and the tests
        # that press Ctrl-C would then wait for nothing.
        kw.setdefault("preexec_fn", lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        return subprocess.Popen([HATCHERY, *args], env=self.env, text=True, **kw)

    def create(self, *args):
        sid = self("sandbox", "create", *args, check=0).stdout.strip()
        assert SBX_ID.fullmatch(sid), sid
        return sid

    def live(self):
        """Ids of live sandboxes, straight from the API."""
        r = self.d.request("GET", "/v1/sandboxes")
        assert r.status == 200, r
        ids = [s["id"] for s in r.json()["sandboxes"]]
        self.d.created.update(ids)
        return ids
