"""A live daemon for the E2B suites, driven by the official E2B SDKs.

It runs on a private templates directory: a copy of the default template
(which also answers as `code-interpreter-v1`) and `base` (templates/base.json:
/bin/bash, git, curl, sudo, pip and a user `user` with passwordless sudo),
built through the API on the rootfs of the agent template, which has the same
packages (HATCHERY_AGENT_TEMPLATES_DIR, `make agent-template`; built there
if missing), so no debootstrap runs here. The SDKs find it through
E2B_API_URL / E2B_SANDBOX_URL."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "tests", "sdk"))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))

import harness  # noqa: E402
import support  # noqa: E402
from harness import KEY, metric, wait_for  # noqa: E402
from harness import pytest_runtest_makereport  # noqa: E402,F401  (a failure's report gets the daemons' warnings)


BASE_SPEC = json.load(open(os.path.join(ROOT, "templates", "base.json")))


def build_base(d):
    r = d.request("POST", "/v1/templates", BASE_SPEC)
    assert r.status == 202, r
    events = d.stream(None, None, path=r.json()["events_url"], method="GET", timeout=900)
    assert events[-1][0] == "done", events[-5:]


@pytest.fixture(scope="session")
def egress_ca():
    """A test CA the daemon's egress proxy trusts for upstreams
    (--egress-upstream-ca-file): servers the header-transform tests start
    (test_headers.py) have certificates it signs. {"dir", "pem", "key"}."""
    d = tempfile.mkdtemp(prefix="hxe2bca-")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
                    "-out", "ca.pem", "-days", "2", "-subj", "/CN=hatchery e2b header test CA"],
                   check=True, capture_output=True, cwd=d)
    yield {"dir": d, "pem": os.path.join(d, "ca.pem"), "key": os.path.join(d, "ca.key")}
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def daemon(egress_ca):
    tdir = support.private_templates()
    harness.seed_agent_rootfs(tdir, BASE_SPEC)
    d = support.start_daemon(extra_args=["--egress-upstream-ca-file", egress_ca["pem"]],
                             templates_dir=tdir, bake=False)
    try:
        build_base(d)
        # Both templates' checkpoints, so creates restore instead of booting.
        wait_for(lambda: metric(d, "hatchery_template_images_baked_total") >= 2, timeout=300,
                 what="template checkpoints")
        os.environ["E2B_API_URL"] = f"http://127.0.0.1:{d.port}/e2b"
        os.environ["E2B_SANDBOX_URL"] = f"http://127.0.0.1:{d.port}/e2b/sandbox"
        os.environ["E2B_API_KEY"] = KEY
        os.environ.pop("E2B_DOMAIN", None)
        os.environ.pop("E2B_DEBUG", None)
        yield d
    finally:
        support.stop_daemon(d)
        shutil.rmtree(tdir, ignore_errors=True)


@pytest.fixture
def sbx(daemon):
    from e2b import Sandbox
    s = Sandbox.create("base", timeout=300)
    yield s
    s.kill()
