"""End-to-end tests of the `hatchery` binary against a live daemon.

One daemon serves the whole session (started here, stopped at the end with
the integration harness's host leak check); after every test no sandbox may
be listed, and whatever a test left is destroyed so the next starts clean."""

import os
import sys

import pytest

# The integration suite's harness: Daemon, KEY, leak checks.
sys.path.append(os.path.join(os.path.dirname(__file__), "..", "integration"))

from cli import Cli  # noqa: E402
from harness import Daemon, wait_baked  # noqa: E402
from harness import pytest_runtest_makereport  # noqa: E402,F401  (a failure's report gets the daemons' warnings)


@pytest.fixture(scope="session")
def daemon(tmp_path_factory):
    # `host` rules are resolved on the host: the test names resolve here,
    # to a documentation address nothing is ever sent to.
    hosts = tmp_path_factory.mktemp("net") / "hosts"
    hosts.write_text("198.51.100.7 pypi.example\n")
    # Its settings in a configuration file (hatcheryd --config), not flags:
    # this suite also proves the file gives the daemon what the flags did.
    d = Daemon(extra_args=["--max-file-bytes", str(4 << 20), "--max-ttl", "3600", "--pool-size", "0",
                           "--net-hosts-file", str(hosts)], config_file=True).start()
    wait_baked(d)
    yield d
    d.cleanup()


@pytest.fixture
def hx(daemon):
    cli = Cli(daemon)
    yield cli
    left = cli.live()
    for sid in left:
        daemon.delete(sid)
    for s in daemon.request("GET", "/v1/snapshots").json()["snapshots"]:
        daemon.request("DELETE", f"/v1/snapshots/{s['id']}")
    assert left == [], f"sandboxes left behind by the test: {left}"


@pytest.fixture
def sbx(hx):
    """A sandbox for one test, destroyed after it (it may be gone already)."""
    sid = hx.create("--ttl", "600")
    yield sid
    hx("sandbox", "kill", sid)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "network: the network policy subcommands")
