"""One network namespace per host for the many-hosts suites: each host
daemon runs in a namespace of its own (`nsenter --net`, so it keeps the
machine's mounts and /run/netns), joined to the others by a bridge the
test creates in the root namespace. The bridge carries a private /24 the
tests own (FABRIC): the database, the control plane and the test's own
servers (git, the scripted model) answer on its gateway address, each
host on an address of its own. Nothing is routed beyond it (no default
route in a host's namespace), so a sandbox's egress can reach no further
than it did on one host.

A host's sandboxes have their network slots (veths, the nftables table)
inside its namespace; the leftover checks look there (harness.py). A host
restarted on its data directory runs in the same namespace, where its
adopted sandboxes' veths are. Cutting one host off from the database is
one nftables rule on its address (test_faults.py)."""

import itertools
import os
import subprocess

BRIDGE = "hxfab0"
FABRIC = "10.250.0"
GATEWAY = f"{FABRIC}.1"
_addrs = itertools.count(10)
_users = [0]


def run(*args):
    r = subprocess.run(list(args), capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


def bridge_up():
    """Creates the bridge (once per test process; counted, so that the
    last user removes it)."""
    _users[0] += 1
    if os.path.exists(f"/sys/class/net/{BRIDGE}"):
        return
    run("ip", "link", "add", BRIDGE, "type", "bridge")
    run("ip", "addr", "add", f"{GATEWAY}/24", "dev", BRIDGE)
    run("ip", "link", "set", BRIDGE, "up")


def bridge_down():
    _users[0] -= 1
    if _users[0] <= 0:
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)


class HostNet:
    """A namespace `hxn-NAME` with `eth0` at FABRIC.N on the bridge."""

    def __init__(self, name):
        n = next(_addrs)
        if n > 250:
            raise RuntimeError("fabric addresses exhausted")
        self.name = f"hxn-{name}"
        self.addr = f"{FABRIC}.{n}"
        self.veth = f"hxf{n}"
        if not os.path.exists(f"/sys/class/net/{BRIDGE}"):
            raise RuntimeError(f"bridge {BRIDGE} is not up (tests/pg/pg.py Postgres(fabric=True))")
        self.delete()
        run("ip", "netns", "add", self.name)
        try:
            run("ip", "link", "add", self.veth, "type", "veth", "peer", "name", "eth0", "netns", self.name)
            run("ip", "link", "set", self.veth, "master", BRIDGE, "up")
            run("ip", "-n", self.name, "addr", "add", f"{self.addr}/24", "dev", "eth0")
            run("ip", "-n", self.name, "link", "set", "eth0", "up")
            run("ip", "-n", self.name, "link", "set", "lo", "up")
        except Exception:
            self.delete()
            raise

    @property
    def path(self):
        return f"/run/netns/{self.name}"

    def exists(self):
        return os.path.exists(self.path)

    def delete(self):
        """Removes the namespace (and with it eth0 and the bridge port)."""
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)
        subprocess.run(["ip", "link", "del", self.veth], capture_output=True)

    def leftovers(self):
        """The namespace or its bridge port, once deleted: both must be gone."""
        left = []
        if self.exists():
            left.append(f"netns {self.name}")
        if os.path.exists(f"/sys/class/net/{self.veth}"):
            left.append(f"veth {self.veth}")
        return left
