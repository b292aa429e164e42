"""Runs a command against a test daemon set up as tests/e2b/conftest.py's
(a private templates directory, the harness's leak checks), with the
`code-interpreter-full` template built on the rootfs `make full-template`
keeps in the test cache, and `base` with --base. For E2B's own suites
(run_upstream_suite.sh) where no `make run` daemon is wanted:

  HATCHERY_BIN_DIR=target/release HATCHERY_TEMPLATES_DIR=/var/lib/hatchery/templates \\
  HATCHERY_AGENT_TEMPLATES_DIR=... HATCHERY_FULL_TEMPLATES_DIR=... \\
    python3 tests/e2b/with_test_daemon.py [--base] tests/e2b/run_upstream_suite.sh interpreter

The command gets HATCHERY_URL and HATCHERY_KEY (the test daemon's), which
run_upstream_suite.sh turns into the SDKs' settings. Exits with its status."""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "tests", "sdk"))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))

import harness  # noqa: E402
import support  # noqa: E402
from harness import KEY, wait_for  # noqa: E402


def build(d, spec, seed):
    seed(d.templates_dir, spec)
    r = d.request("POST", "/v1/templates", spec)
    assert r.status == 202, r
    events = d.stream(None, None, path=r.json()["events_url"], method="GET", timeout=900)
    assert events[-1][0] == "done", events[-5:]
    wait_for(lambda: d.request("GET", f"/v1/templates/{spec['name']}").json().get("state") == "ready",
             timeout=120, what=f"{spec['name']} ready")


def main(argv):
    base = argv[:1] == ["--base"]
    cmd = argv[1:] if base else argv
    if not cmd:
        sys.exit(__doc__)
    load = lambda name: json.load(open(os.path.join(ROOT, "templates", name)))  # noqa: E731
    tdir = support.private_templates()
    d = support.start_daemon(templates_dir=tdir, bake=False)
    try:
        build(d, load("code-interpreter-full.json"),
              lambda tdir, spec: harness.seed_cached_rootfs(tdir, spec, harness.full_templates()))
        if base:
            build(d, load("base.json"), harness.seed_agent_rootfs)
        env = dict(os.environ, HATCHERY_URL=f"http://127.0.0.1:{d.port}", HATCHERY_KEY=KEY)
        return subprocess.run(cmd, env=env).returncode
    finally:
        for sid in support.live_sandboxes(d):  # the suites' leftovers (a failed test's)
            d.request("DELETE", f"/v1/sandboxes/{sid}")
        support.stop_daemon(d)
        subprocess.run(["rm", "-rf", tdir])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
