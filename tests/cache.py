#!/usr/bin/env python3
"""The test cache outside the clone: read-only things the suites need and
that do not change from run to run, built once and kept by the hash of what
produced them (docs/testing.md).

    tests/cache.py venv NAME REQFILE [--system-site-packages]
    tests/cache.py node-modules NAME DIR        # DIR holds package.json and package-lock.json
    tests/cache.py wheels NAME REQFILE

Each prints the path of the ready entry, building it first if it is missing
or stale: the key is the SHA-256 of the inputs' bytes, the flags and the
interpreter's or node's version, so an edited requirements file or lockfile
gets a new entry and the old one of that NAME is deleted. An entry counts
only once its `.complete` marker exists, and a build holds a lock, so an
interrupted or concurrent build never hands out a half-made entry.

The cache lives in $HATCHERY_TEST_CACHE (default /var/cache/hatchery-test);
deleting it is always safe (the next run rebuilds what it needs). pip and
npm download caches live there too, so a rebuild does not fetch again.
"""

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys

CACHE = os.environ.get("HATCHERY_TEST_CACHE", "/var/cache/hatchery-test")
PYTHON = "/usr/bin/python3"


def key(*parts):
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else str(p).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def tool_version(argv):
    return subprocess.run(argv, capture_output=True, text=True).stdout.strip()


def entry(kind, name, k, build):
    """The ready entry kind/NAME-k, made by build(path) under a lock."""
    base = os.path.join(CACHE, kind)
    os.makedirs(base, exist_ok=True)
    path = os.path.join(base, f"{name}-{k}")
    done = os.path.join(path, ".complete")
    if os.path.exists(done):
        return path
    with open(os.path.join(base, f".{name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(done):
            return path
        # Stale entries of this name (other keys) and a half-made one go.
        for old in os.listdir(base):
            if old.startswith(name + "-") and old[len(name) + 1:].isalnum() and len(old) == len(name) + 17:
                shutil.rmtree(os.path.join(base, old), ignore_errors=True)
        build(path)
        open(done, "w").close()
    return path


def env():
    return dict(os.environ, PIP_CACHE_DIR=os.path.join(CACHE, "pip"),
                npm_config_cache=os.path.join(CACHE, "npm-cache"))


def check(argv, **kw):
    r = subprocess.run(argv, env=env(), **kw)
    if r.returncode != 0:
        sys.exit(f"cache: {' '.join(argv)} exited with {r.returncode}")


def venv(name, reqfile, system_site):
    req = open(reqfile, "rb").read()
    k = key("venv", req, system_site, tool_version([PYTHON, "--version"]))

    def build(path):
        check([PYTHON, "-m", "venv", *(["--system-site-packages"] if system_site else []), path])
        check([os.path.join(path, "bin", "pip"), "install", "-q", "--disable-pip-version-check", "-r", reqfile])
    return entry("venv", name, k, build)


def node_modules(name, src):
    files = [os.path.join(src, f) for f in ("package.json", "package-lock.json")]
    k = key("npm", *(open(f, "rb").read() for f in files), tool_version(["node", "--version"]))

    def build(path):
        os.makedirs(path)
        for f in files:
            shutil.copy(f, path)
        check(["npm", "ci", "--no-audit", "--no-fund", "--silent", "--prefer-offline"], cwd=path)
    return entry("npm", name, k, build)


def wheels(name, reqfile):
    req = open(reqfile, "rb").read()
    k = key("wheels", req, tool_version([PYTHON, "--version"]))

    def build(path):
        os.makedirs(path)
        check([PYTHON, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--only-binary=:all:",
               "--no-deps", "-d", path, "-r", reqfile])
    return entry("wheels", name, k, build)


def main():
    a = sys.argv[1:]
    if len(a) >= 3 and a[0] == "venv":
        print(venv(a[1], a[2], "--system-site-packages" in a[3:]))
    elif len(a) == 3 and a[0] == "node-modules":
        print(node_modules(a[1], a[2]))
    elif len(a) == 3 and a[0] == "wheels":
        print(wheels(a[1], a[2]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
