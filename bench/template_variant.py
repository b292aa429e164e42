#!/usr/bin/env python3
"""What the `code-interpreter-full` template costs beside the default one
(issue 35): its rootfs and checkpoint sizes, a create's time (a restore
from the checkpoint: what a pool refill costs; the daemon runs with
`--pool-size 0`, so every create restores), and the first run of each
kernel in a restored sandbox.

    HATCHERY_BIN_DIR=target/release /usr/bin/python3 bench/template_variant.py [--runs N]

The rootfs comes from the test cache (harness.full_templates: the
`make full-template` build, made here if missing, which is the cold
build's debootstrap); the template's setup and checkpoint are built through
the API of a private daemon, and that build is timed too. Bounded: N
creates of each template, all traffic on 127.0.0.1."""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "sdk"))

import harness  # noqa: E402
import support  # noqa: E402

SPEC = json.load(open(os.path.join(HERE, "..", "templates", "code-interpreter-full.json")))


def du_mib(path):
    out = subprocess.run(["du", "-sm", path], capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


def timed_create(d, template):
    t0 = time.monotonic()
    sid = d.create(template=template, ttl_seconds=300)
    return sid, time.monotonic() - t0


def first_run(d, sid, language, code):
    t0 = time.monotonic()
    r = d.request("POST", f"/v1/sandboxes/{sid}/code", {"code": code, "language": language, "timeout_seconds": 120})
    return r, time.monotonic() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    t0 = time.monotonic()
    cache = harness.full_templates()
    print(f"rootfs in the test cache: {time.monotonic() - t0:.1f} s (a no-op when current)")
    key = harness.rootfs_key(SPEC)
    print(f"rootfs size: {du_mib(os.path.join(cache, SPEC['name'], 'rootfs-' + key))} MiB")
    tdir = support.private_templates()
    d = None
    try:
        harness.seed_cached_rootfs(tdir, SPEC, cache)
        d = support.start_daemon(templates_dir=tdir, bake=True)
        t0 = time.monotonic()
        r = d.request("POST", "/v1/templates", SPEC)
        assert r.status == 202, r
        events = d.stream(None, None, path=r.json()["events_url"], method="GET", timeout=1800)
        assert events[-1][0] == "done", events[-5:]
        print(f"setup and checkpoint through the API: {time.monotonic() - t0:.1f} s")
        for name in ("code-interpreter", SPEC["name"]):
            imgs = [p for p in os.listdir(os.path.join(d.data_dir, "images")) if p.startswith(name + "-")
                    and not p[len(name) + 1:].startswith("full")]
            for p in imgs:
                print(f"checkpoint {p}: {du_mib(os.path.join(d.data_dir, 'images', p))} MiB")
        for name in ("code-interpreter", SPEC["name"]):
            times = []
            for _ in range(a.runs):
                sid, dt = timed_create(d, name)
                times.append(dt)
                d.delete(sid)
                d.created.discard(sid)
            print(f"create (restore) {name}: median {statistics.median(times) * 1000:.0f} ms "
                  f"(min {min(times) * 1000:.0f}, max {max(times) * 1000:.0f}, {a.runs} runs)")
        sid, _ = timed_create(d, SPEC["name"])
        for language, code in (("python", "import numpy, pandas, matplotlib.pyplot"), ("python", "1")):
            r, dt = first_run(d, sid, language, code)
            print(f"run {language} {code!r}: {dt * 1000:.0f} ms ({r.status})")
        d.delete(sid)
        d.created.discard(sid)
    finally:
        if d is not None:
            support.stop_daemon(d)
        shutil.rmtree(tdir, ignore_errors=True)


if __name__ == "__main__":
    main()
