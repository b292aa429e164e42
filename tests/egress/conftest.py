import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, os.path.join(HERE, "..", "sessions"))
sys.path.insert(0, HERE)

from egress_servers import EgressServers  # noqa: E402
from gitserver import GitServer  # noqa: E402
from harness import BIN_DIR  # noqa: E402

REPO = os.path.abspath(os.path.join(HERE, "..", ".."))


@pytest.fixture(scope="session")
def agent_templates():
    """A templates dir holding `agent-session` (curl, git, pip): the one
    `make agent-template` keeps in the test cache, built here if missing."""
    d = os.environ.get("HATCHERY_AGENT_TEMPLATES_DIR") or os.path.join(
        os.environ.get("HATCHERY_TEST_CACHE", "/var/cache/hatchery-test"), "agent-templates")
    # A no-op when the built version is current.
    os.makedirs(d, exist_ok=True)
    subprocess.run([os.path.join(BIN_DIR, "hatchery"), "template", "build-local", "--templates-dir", d,
                    os.path.join(REPO, "templates", "agent-session.json")], check=True, timeout=900)
    return d


# The suite's destinations, one set per test module (each module's daemon
# and sessions use them).
@pytest.fixture(scope="module")
def servers():
    s = EgressServers()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def git_server():
    g = GitServer().start()
    yield g
    g.stop()
