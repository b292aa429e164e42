"""The Rust client (crates/hatchery-client) against a live daemon: the
client_smoke example drives every part of the API through it and deletes
what it made; this checks its report and that nothing is left."""

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../integration"))

from harness import BIN_DIR, KEY, Daemon  # noqa: E402

EXAMPLE = os.path.join(BIN_DIR, "examples", "client_smoke")


def test_client_smoke():
    d = Daemon(extra_args=["--max-ttl", "3600", "--pool-size", "0"]).start()
    try:
        env = dict(os.environ, HATCHERY_URL=f"http://127.0.0.1:{d.port}", HATCHERY_API_KEY=KEY)
        r = subprocess.run([EXAMPLE], env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"{r.stdout}\n{r.stderr}\n{d.log()}"
        report = json.loads(r.stdout.strip().splitlines()[-1])
        assert report["ok"] is True
        assert report["forks"] == 3
        assert report["blocking_events"] >= 2
        # The cpu limit stopped the busy loop near its limit, not at the
        # timeout.
        assert 300 <= report["cpu_limit_cpu_ms"] < 20000, report
        # The client deleted everything it made (the harness's cleanup
        # would delete leftovers; assert there are none first).
        assert d.request("GET", "/v1/sandboxes").json()["sandboxes"] == []
        assert d.request("GET", "/v1/snapshots").json()["snapshots"] == []
    finally:
        d.cleanup()
