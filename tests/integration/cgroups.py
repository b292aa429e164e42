"""A sandbox's host cgroups (cgroup v1), read by tests and benchmarks that
check parking (its freezer) and CPU use (its cpuacct)."""

import time


def freezer(sid, value=None):
    """The freezer state of `sid` (`THAWED`, `FREEZING`, `FROZEN`), after
    writing `value` to it if given."""
    p = f"/sys/fs/cgroup/freezer/{sid}/freezer.state"
    if value:
        with open(p, "w") as f:
            f.write(value)
    with open(p) as f:
        return f.read().strip()


def cpu_ns(sid):
    with open(f"/sys/fs/cgroup/cpuacct/{sid}/cpuacct.usage") as f:
        return int(f.read())


def parked_within(sid, seconds):
    """True once `sid` is FROZEN, sampled until `seconds` have passed."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        if freezer(sid) == "FROZEN":
            return True
        time.sleep(0.02)
    return False
