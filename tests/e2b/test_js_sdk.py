"""The `e2b` npm package (npm ci from tests/e2b/js/package-lock.json into the
test cache, tests/cache.py; the Makefile passes its path) against the
suite's daemon."""

import os
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
JS = os.environ.get("HATCHERY_E2B_JS", os.path.join(HERE, "..", "..", "target", "e2b-js"))
MODULE = os.path.join(JS, "node_modules", "e2b", "dist", "index.mjs")


def test_js_sdk(daemon):
    if not os.path.exists(MODULE):
        pytest.fail("the e2b npm package is not installed: run `make e2b-test` (tests/cache.py node-modules)")
    env = dict(os.environ, E2B_JS_MODULE=os.path.abspath(MODULE))
    r = subprocess.run(["node", "--test", os.path.join(HERE, "js", "sdk.test.mjs")], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
