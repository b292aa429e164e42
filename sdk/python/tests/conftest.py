"""One real daemon for the whole suite (started and stopped here), on a
private copy of the default template. After every test no sandbox may be
listed; at the end the harness checks nothing is left on the host."""

import os
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "sdk"))

import support  # noqa: E402
from harness import pytest_runtest_makereport  # noqa: E402,F401  (a failure's report gets the daemons' warnings)

import hatchery  # noqa: E402



@pytest.fixture(scope="session")
def templates_dir():
    tdir = support.private_templates()
    yield tdir
    support.remove_templates(tdir)


@pytest.fixture(scope="session")
def daemon(templates_dir):
    d = support.start_daemon(templates_dir=templates_dir)
    url = f"http://127.0.0.1:{d.port}"
    # The default client (and subprocesses) configure from the environment.
    os.environ["HATCHERY_URL"] = url
    os.environ["HATCHERY_API_KEY"] = support.KEY
    hatchery.configure()
    yield d
    support.stop_daemon(d)


@pytest.fixture(scope="session")
def url(daemon):
    return f"http://127.0.0.1:{daemon.port}"


@pytest.fixture
def client(url):
    c = hatchery.Client(url, support.KEY)
    yield c
    c.close()


@pytest.fixture(autouse=True)
def no_leftover_sandboxes(request):
    yield
    if "daemon" not in request.fixturenames:
        return
    d = request.getfixturevalue("daemon")
    left = support.live_sandboxes(d)
    for sid in left:
        d.created.add(sid)
        d.delete(sid)
    assert not left, f"test left sandboxes behind: {left}"


@pytest.fixture
def sbx(daemon, client):
    s = hatchery.Sandbox.create(ttl_seconds=300, metadata={"suite": "python"}, client=client)
    daemon.created.add(s.id)
    yield s
    s.kill()


@pytest.fixture(scope="session")
def proxy(daemon):
    p = support.Proxy(daemon.port)
    yield p
    p.close()
