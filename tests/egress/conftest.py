import os
import sys

import pytest

HERE = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, os.path.join(HERE, "..", "sessions"))
sys.path.insert(0, HERE)

from egress_servers import EgressServers, egress_net  # noqa: E402
from gitserver import GitServer  # noqa: E402
import harness  # noqa: E402
from harness import pytest_runtest_makereport  # noqa: E402,F401  (a failure's report gets the daemons' warnings)


@pytest.fixture(scope="session")
def agent_templates():
    """A templates dir holding `agent-session` (curl, git, sudo, pip): the one
    `make agent-template` keeps in the test cache, built here if missing."""
    return harness.agent_templates()


@pytest.fixture(scope="session")
def testnet():
    """The namespace the suite's servers listen in (egress_servers.py), made
    for the run and removed after it, a failed one too."""
    n = egress_net().up()
    try:
        yield n
    finally:
        n.down()
    assert not n.left(), n.left()


# The suite's destinations, one set per test module (each module's daemon
# and sessions use them).
@pytest.fixture(scope="module")
def servers(testnet):
    s = EgressServers(testnet)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def git_server():
    g = GitServer().start()
    yield g
    g.stop()
