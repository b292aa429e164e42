"""Runs a command against a daemon set up for sessions (for suites that
cannot start one themselves, the TypeScript SDK's): a git daemon with the
demo repository and the scripted model on loopback, and a daemon that
reaches the model as a host service. Env: HATCHERY_URL, HATCHERY_API_KEY,
HATCHERY_TEST_REPO. Afterwards the harness's teardown checks the host."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, HERE)

from gitserver import GitServer  # noqa: E402
from harness import KEY  # noqa: E402
from scripted_model import ScriptedModel  # noqa: E402
from sessions_support import DEMO_FILES, SCRIPTS, SessionDaemon  # noqa: E402


def main(argv):
    g = GitServer().start()
    m = ScriptedModel(SCRIPTS).start()
    d = SessionDaemon(m.port).start()
    rc = 1
    try:
        env = dict(os.environ, HATCHERY_URL=f"http://127.0.0.1:{d.port}", HATCHERY_API_KEY=KEY,
                   HATCHERY_TEST_REPO=g.add_repo("ts", DEMO_FILES))
        rc = subprocess.run(argv, env=env).returncode
    finally:
        try:
            d.cleanup_sessions()
        except AssertionError as e:
            print(f"with_session_daemon: {e}", file=sys.stderr)
            rc = rc or 1
        m.stop()
        g.stop()
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
