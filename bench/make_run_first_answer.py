"""`make run`'s time to its first answer (GET /healthz 200), issue 35.

Runs `make run` RUNS times for each variant, alternating, on a data dir of
its own whose default template is already built and baked (so `make
template` is a no-op, as on every start but the first), and prints each
time and the median:

- `before`: `make run BUILD_TEMPLATES=`, the command line before issue 35
  (no template built in the background);
- `after`: `make run` as it is now, with `templates/base.json` built in the
  background. Before each such run `base` is made absent again (its rootfs
  stays, so the build is the checkpoint bake, not a debootstrap): the daemon
  really has a build to do at every start measured. Each run waits for that
  build to end before stopping the daemon.

    sudo /usr/bin/python3 bench/make_run_first_answer.py --data-dir DIR --port P [--runs 5]

DIR must hold templates/code-interpreter (built) and
templates/base/rootfs-<key> (any complete rootfs of base's packages).
The daemon gets a network prefix and range of its own (bgb,
10.197.0.0/16) so it runs beside other daemons.
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def answered(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def templates(port, key):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/templates",
                                 headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return {t["name"]: t for t in json.load(r)["templates"]}


def one_run(args, variant):
    tdir = os.path.join(args.data_dir, "templates")
    if variant == "after":
        for p in ("current", "versions"):
            path = os.path.join(tdir, "base", p)
            if os.path.isdir(path):
                shutil.rmtree(path)
            elif os.path.exists(path):
                os.unlink(path)
    make = ["make", "-s", "run", f"DATA_DIR={args.data_dir}", f"LISTEN=127.0.0.1:{args.port}"]
    if variant == "before":
        make.append("BUILD_TEMPLATES=")
    env = dict(os.environ, HATCHERY_NET_PREFIX="bgb", HATCHERY_NET_RANGE="10.197.0.0/16")
    log = open(os.path.join(args.data_dir, f"make-run-{variant}.log"), "ab")
    t0 = time.monotonic()
    proc = subprocess.Popen(make, cwd=ROOT, env=env, stdout=log, stderr=log, start_new_session=True)
    try:
        while not answered(args.port):
            if proc.poll() is not None:
                raise RuntimeError(f"make run exited with {proc.returncode}; see {log.name}")
            time.sleep(0.02)
        took = time.monotonic() - t0
        note = ""
        if variant == "after":
            key = open(os.path.join(args.data_dir, "api_key")).read().strip()
            t = templates(args.port, key).get("base")
            note = f"base: {t['state']} {t['build'] and t['build']['step']}" if t else "base: absent"
            deadline = time.time() + 600
            while time.time() < deadline:
                t = templates(args.port, key).get("base")
                if t and t["state"] == "ready" and t["build"] is None:
                    note += f", ready {time.monotonic() - t0:.1f} s after make run"
                    break
                time.sleep(0.5)
            else:
                note += ", NOT ready after 600 s"
        return took, note
    finally:
        # make and hatcheryd are this run's own process group.
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=120)
        while answered(args.port):
            time.sleep(0.1)
        time.sleep(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    times = {"before": [], "after": []}
    for i in range(args.runs):
        for variant in ("before", "after"):
            took, note = one_run(args, variant)
            times[variant].append(took)
            load = os.getloadavg()[0]
            print(f"run {i + 1} {variant:6} {took:6.2f} s  load {load:.1f}  {note}", flush=True)
    for variant, ts in times.items():
        print(f"{variant:6} median {statistics.median(ts):.2f} s  min {min(ts):.2f}  max {max(ts):.2f}  "
              f"({len(ts)} runs)")


if __name__ == "__main__":
    main()
