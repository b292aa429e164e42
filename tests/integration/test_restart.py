"""The daemon can die at any moment: sandboxes keep their TTL, a restart
re-adopts the living and destroys the expired and the unknown."""

import os
import subprocess
import time

from harness import TEST_DB, Daemon, arg, wait_baked


def restart(d):
    return Daemon(extra_args=d.extra_args, data_dir=d.data_dir).start()


def test_crash_then_restart_readopts_live_sandboxes(daemon):
    sid = daemon.create(ttl_seconds=120)
    daemon.put_file(sid, "/work/state.txt", b"kept")
    daemon.crash()
    d2 = restart(daemon)
    d2.created |= daemon.created
    try:
        assert d2.request("GET", f"/v1/sandboxes/{sid}").json()["state"] == "running"
        assert d2.exec(sid, "cat /work/state.txt")["stdout"] == "kept"
    finally:
        d2.cleanup()


def test_ttl_holds_while_the_daemon_is_dead(daemon):
    wait_baked(daemon)
    sid = daemon.create(ttl_seconds=2)
    daemon.crash()
    time.sleep(5)  # TTL plus the shim's 2 s grace
    # No daemon: the shim enforced the TTL on its own. Its network slot
    # stays (deny-all) until the next start reclaims it, checked at cleanup.
    daemon.wait_no_leftovers(timeout=10, net=False)
    d2 = restart(daemon)
    d2.created |= daemon.created
    try:
        assert d2.request("GET", f"/v1/sandboxes/{sid}").status == 404
    finally:
        d2.cleanup()


def test_restart_destroys_containers_it_does_not_know(daemon):
    sid = daemon.create(ttl_seconds=120)
    daemon.crash()
    # Forget everything, as if the crash came before the state write.
    if TEST_DB:
        host = arg(daemon.extra_args, "--host-id")
        subprocess.run(["psql", arg(daemon.extra_args, "--db"), "-qc", f"DELETE FROM core_sandboxes WHERE host_id = '{host}'; "
                        f"DELETE FROM core_net WHERE host_id = '{host}'"], check=True, capture_output=True)
    for f in os.listdir(daemon.data_dir):
        if f.startswith("hatchery.db"):
            os.unlink(os.path.join(daemon.data_dir, f))
    d2 = restart(daemon)
    d2.created |= daemon.created
    try:
        d2.wait_no_leftovers(timeout=20)
        assert d2.request("GET", "/v1/sandboxes").json()["sandboxes"] == []
    finally:
        d2.cleanup()
    assert sid
