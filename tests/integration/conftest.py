import pytest

from harness import Daemon
from harness import pytest_runtest_makereport  # noqa: E402,F401  (a failure's report gets the daemons' warnings)

DAEMON_ARGS = ["--max-file-bytes", str(4 << 20), "--max-ttl", "3600", "--pool-size", "0"]


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "fresh_daemon: this test gets a daemon of its own even in a module that shares one "
        "(it reads absolute counters, changes the daemon's files, stops or restarts it)")


@pytest.fixture(scope="module")
def _shared(request):
    """The daemon a module shares, started on first use; `holder["d"]` is
    dropped (and a new one started) when a test leaves it dead or dirty."""
    holder = {"d": None}
    yield holder
    if holder["d"] is not None:
        holder["d"].cleanup()


@pytest.fixture
def daemon(request, _shared):
    """A daemon; at the end every sandbox must be gone from the host
    (processes, cgroups, mounts, state dirs).

    A module that sets `SHARED_DAEMON = True` shares one daemon between its
    tests (starting one costs about 0.8 s): after each test every sandbox
    and snapshot is deleted and the same leak check runs, and a daemon that
    died during a test fails that test and is replaced. Tests marked
    `fresh_daemon`, and every test of the other modules, get their own."""
    shared = getattr(request.module, "SHARED_DAEMON", False) and \
        request.node.get_closest_marker("fresh_daemon") is None
    if not shared:
        d = Daemon(extra_args=DAEMON_ARGS).start()
        yield d
        d.cleanup()
        return
    d = _shared["d"]
    if d is None:
        d = _shared["d"] = Daemon(extra_args=DAEMON_ARGS).start()
    yield d
    try:
        d.reset()
    except BaseException:
        _shared["d"] = None
        d.cleanup()
        raise


@pytest.fixture
def sandbox(daemon):
    return daemon.create(ttl_seconds=300)
