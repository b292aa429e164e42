import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from pg_harness import Gateway, assert_no_sandboxes, start_daemon  # noqa: E402
from harness import pytest_runtest_makereport  # noqa: E402,F401  (a failure's report gets the daemons' warnings)


@pytest.fixture(scope="module")
def daemon():
    """One real daemon per test module, with a small warm pool. At the end:
    no sandbox listed, and the harness's host leak checks (processes,
    cgroups, mounts, state dirs) pass."""
    d = start_daemon(pool=2)
    yield d
    try:
        assert_no_sandboxes(d)
    finally:
        d.cleanup()


@pytest.fixture
def gateway_factory(daemon):
    made = []

    def make(*args, env=None):
        g = Gateway(daemon, args, env).start()
        made.append(g)
        return g

    yield make
    for g in made:
        g.cleanup()
    # Every test leaves nothing behind on the daemon.
    assert_no_sandboxes(daemon)
