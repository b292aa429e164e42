import os
import sys

import pytest

HERE = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, os.path.join(HERE, "..", "sessions"))
sys.path.insert(0, HERE)

from broker_support import SCRIPTS, BrokerDaemon  # noqa: E402
from harness import pytest_runtest_makereport  # noqa: E402,F401  (a failure's report gets the daemons' warnings)
from forge import Forge  # noqa: E402
from gitserver import GitServer  # noqa: E402
from pushserver import PushServer  # noqa: E402
from scripted_model import ScriptedModel  # noqa: E402


@pytest.fixture(scope="module")
def git_server():
    g = GitServer().start()
    yield g
    g.stop()


@pytest.fixture(scope="module")
def push_server(git_server):
    p = PushServer(git_server.root).start()
    yield p
    p.stop()


@pytest.fixture(scope="module")
def forge():
    f = Forge().start()
    yield f
    f.stop()


@pytest.fixture(scope="module")
def model():
    m = ScriptedModel(SCRIPTS).start()
    yield m
    m.stop()


@pytest.fixture
def bd(model, git_server, push_server, forge):
    """A daemon whose broker pushes to the push server with its write
    credential and opens pull requests on the test forge; every sandbox
    must be gone from the host at the end."""
    d = BrokerDaemon(model.port, git_server, push_server, forge).start()
    yield d
    d.cleanup_sessions()
