import pytest

from harness import Daemon


@pytest.fixture
def daemon():
    """A fresh daemon per test; at the end every sandbox must be gone from
    the host (processes, cgroups, mounts, state dirs)."""
    d = Daemon(extra_args=["--max-file-bytes", str(4 << 20), "--max-ttl", "3600", "--pool-size", "0"]).start()
    yield d
    d.cleanup()


@pytest.fixture
def sandbox(daemon):
    return daemon.create(ttl_seconds=300)
