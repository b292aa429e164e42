import os
import sys

import pytest

HERE = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, HERE)

from gitserver import GitServer  # noqa: E402
from scripted_model import ScriptedModel  # noqa: E402
from sessions_support import SCRIPTS, SessionDaemon  # noqa: E402
from harness import pytest_runtest_makereport  # noqa: E402,F401  (a failure's report gets the daemons' warnings)


@pytest.fixture(scope="module")
def git_server():
    g = GitServer().start()
    yield g
    g.stop()


@pytest.fixture(scope="module")
def model():
    m = ScriptedModel(SCRIPTS).start()
    yield m
    m.stop()


@pytest.fixture
def sd(model):
    """A daemon with the model reachable from sandboxes as a host service;
    every sandbox must be gone from the host at the end."""
    d = SessionDaemon(model.port).start()
    yield d
    d.cleanup_sessions()
