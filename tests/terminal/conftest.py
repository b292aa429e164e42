import os
import sys

import pytest

HERE = os.path.dirname(__file__)
# The integration harness (Daemon, KEY, leak checks) and the playground's
# DevTools driver (headless Chromium, stdlib only).
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, os.path.join(HERE, "..", "playground"))

import cdp  # noqa: E402
from harness import Daemon  # noqa: E402
from harness import pytest_runtest_makereport  # noqa: E402,F401  (a failure's report gets the daemons' warnings)

# Chromium as docs/operations.md runs it for tests: no QUIC, nothing in the
# background (the rest of the flags are cdp.py's).
cdp.CHROMIUM_FLAGS = cdp.CHROMIUM_FLAGS + ["--disable-quic"]


@pytest.fixture(scope="module")
def daemon():
    d = Daemon(extra_args=["--pool-size", "0", "--max-ttl", "3600"]).start()
    yield d
    d.cleanup()


@pytest.fixture
def browser():
    b = cdp.Browser(width=1000, height=700)
    yield b
    b.close()
