"""A private PostgreSQL for tests: the Debian package's binaries, run as the
`postgres` user (it refuses root) on a free loopback port with its data and
socket in a temporary directory. Nothing outside that directory is touched,
and stop() removes it.

    with Postgres() as pg: pg.dsn  ->  postgres://postgres@127.0.0.1:PORT/hatchery

Also a command line: `python3 tests/pg/pg.py -- CMD...` runs CMD with
HATCHERY_TEST_PG_DSN set and stops the server afterwards."""

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(1, os.path.join(os.path.dirname(__file__), "..", "integration"))
import hostnet  # noqa: E402
from harness import free_port  # noqa: E402,F401  (re-exported: the gateway tests take it from here)


def pg_bin(name):
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise RuntimeError(f"PostgreSQL's {name} not found under /usr/lib/postgresql (scripts/setup-host.sh installs it)")
    return found[-1]


def as_postgres(args, **kw):
    return subprocess.run(["runuser", "-u", "postgres", "--", *args], check=True,
                          capture_output=True, text=True, **kw)


class Postgres:
    def __init__(self, db="hatchery", fabric=False):
        """fabric: also answer on the hosts' bridge (hostnet.py), which
        this server brings up and, at stop(), down."""
        self.db = db
        self.fabric = fabric
        self._bridge = False
        self.dir = tempfile.mkdtemp(prefix="hxpg-")
        os.chmod(self.dir, 0o755)
        shutil.chown(self.dir, "postgres", "postgres")
        self.data = os.path.join(self.dir, "data")
        self.port = free_port()
        self.log = os.path.join(self.dir, "pg.log")

    @property
    def dsn(self):
        return self.dsn_via("127.0.0.1")

    @property
    def fabric_dsn(self):
        """What a host in a namespace of its own (hostnet.py) connects to."""
        return self.dsn_via(hostnet.GATEWAY)

    def dsn_via(self, addr):
        return f"postgres://postgres@{addr}:{self.port}/{self.db}"

    def start(self):
        listen = "127.0.0.1"
        if self.fabric:
            if not self._bridge:
                hostnet.bridge_up()
                self._bridge = True
            listen += "," + hostnet.GATEWAY
        if not os.path.exists(self.data):
            as_postgres([pg_bin("initdb"), "-D", self.data, "-A", "trust", "-U", "postgres", "--no-sync",
                         "-E", "UTF8"])
            # The hosts' bridge (hostnet.py): a private /24 of the test's own.
            with open(os.path.join(self.data, "pg_hba.conf"), "a") as f:
                f.write(f"host all all {hostnet.FABRIC}.0/24 trust\n")
        as_postgres([pg_bin("pg_ctl"), "-D", self.data, "-l", self.log, "-w", "-t", "60", "start", "-o",
                     f"-p {self.port} -k {self.dir} -c listen_addresses={listen} -c fsync=on"])
        deadline = time.time() + 30
        while True:
            r = subprocess.run(["runuser", "-u", "postgres", "--", pg_bin("psql"), "-h", self.dir, "-p",
                                str(self.port), "-d", "postgres", "-Atc",
                                f"SELECT 1 FROM pg_database WHERE datname = '{self.db}'"],
                               capture_output=True, text=True)
            if r.returncode == 0:
                break
            if time.time() > deadline:
                raise RuntimeError(f"PostgreSQL did not come up: {r.stderr}")
            time.sleep(0.2)
        if r.stdout.strip() != "1":
            as_postgres([pg_bin("createdb"), "-h", self.dir, "-p", str(self.port), self.db])
        return self

    def kill(self):
        """SIGKILL the postmaster (a crash), leaving the data directory."""
        pid = int(open(os.path.join(self.data, "postmaster.pid")).readline())
        os.kill(pid, 9)
        time.sleep(0.5)

    def stop(self):
        if os.path.exists(os.path.join(self.data, "postmaster.pid")):
            subprocess.run(["runuser", "-u", "postgres", "--", pg_bin("pg_ctl"), "-D", self.data, "-m",
                            "immediate", "-w", "stop"], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)
        if self._bridge:
            hostnet.bridge_down()
            self._bridge = False

    def __enter__(self):
        return self.start()

    def __exit__(self, *a):
        self.stop()


if __name__ == "__main__":
    cmd = sys.argv[sys.argv.index("--") + 1:]
    with Postgres() as pg:
        rc = subprocess.run(cmd, env=dict(os.environ, HATCHERY_TEST_PG_DSN=pg.dsn)).returncode
    sys.exit(rc)
