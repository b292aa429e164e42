#!/usr/bin/env python3
"""`make bench`: Hatchery against the raw runsc CLI, measured in one run on
this machine. Absolute times are noisy here; the ratio to the baseline taken
in the same run is the figure to compare. Every loop is bounded; all
traffic is to 127.0.0.1."""

import concurrent.futures
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../tests/integration"))
from harness import TEMPLATES_DIR, Daemon  # noqa: E402

ROOTFS = os.path.join(TEMPLATES_DIR, "code-interpreter/rootfs")
N = int(os.environ.get("BENCH_N", "30"))


def pct(xs, p):
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(p / 100 * (len(xs) - 1)))))
    return xs[k]


def timed(f, n):
    out = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        out.append((time.perf_counter() - t) * 1000)
    return out


class RawRunsc:
    """The baseline: runsc driven directly, same rootfs, platform and flags."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="hxb-", dir="/tmp")
        self.root = os.path.join(self.dir, "root")
        self.flags = [f"--root={self.root}", "--platform=systrap", "--network=none", "--overlay2=root:memory"]
        self.n = 0

    def bundle(self, args):
        self.n += 1
        b = os.path.join(self.dir, f"b{self.n}")
        os.makedirs(b)
        spec = {
            "ociVersion": "1.0.0",
            "process": {"args": args, "cwd": "/", "user": {"uid": 0, "gid": 0},
                        "env": ["PATH=/usr/local/bin:/usr/bin:/bin"]},
            "root": {"path": ROOTFS, "readonly": False},
            "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
            "linux": {"namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount", "network")],
                      "resources": {"memory": {"limit": 512 << 20}}},
        }
        json.dump(spec, open(os.path.join(b, "config.json"), "w"))
        return b, f"raw{self.n}"

    def runsc(self, *args, **kw):
        return subprocess.run(["runsc", *self.flags, *args], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, **kw)

    def run_to_exit(self):
        b, cid = self.bundle(["python3", "-c", "print(1)"])
        self.runsc("run", f"--bundle={b}", cid, check=True)
        self.runsc("delete", "--force", cid)

    def start_idle(self):
        b, cid = self.bundle(["sleep", "100000"])
        self.runsc("run", "--detach", f"--bundle={b}", cid, check=True)
        return cid

    def close(self):
        for c in os.listdir(self.dir):
            if c.startswith("b"):
                self.runsc("delete", "--force", "raw" + c[1:])
        shutil.rmtree(self.dir, ignore_errors=True)


def row(name, xs, base=None):
    p50, p99 = pct(xs, 50), pct(xs, 99)
    ratio = f"{p50 / pct(base, 50):.2f}x" if base else ""
    print(f"| {name:<44} | {len(xs):>4} | {p50:>8.1f} | {p99:>8.1f} | {ratio:>8} |")
    return {"name": name, "n": len(xs), "p50_ms": round(p50, 2), "p99_ms": round(p99, 2), "ratio_p50": ratio}


def main():
    raw = RawRunsc()
    d = Daemon(extra_args=["--max-sandboxes", "32"]).start()
    results = []
    try:
        # Baselines.
        base_run = timed(raw.run_to_exit, max(5, N // 3))
        cid = raw.start_idle()
        base_exec_true = timed(lambda: raw.runsc("exec", cid, "/bin/true", check=True), N)
        base_exec_py = timed(lambda: raw.runsc("exec", cid, "python3", "-c", "print(1)", check=True), max(5, N // 2))

        # Hatchery.
        sid = d.create(ttl_seconds=600)
        d.exec(sid, "true")
        h_true = timed(lambda: d.exec(sid, argv=["true"]), N * 3)
        h_py = timed(lambda: d.exec(sid, argv=["python3", "-c", "print(1)"]), N)
        d.delete(sid)

        def create_delete():
            t = time.perf_counter()
            s = d.create(ttl_seconds=60)
            ms = (time.perf_counter() - t) * 1000
            d.delete(s)
            return ms
        h_create = [create_delete() for _ in range(max(5, N // 2))]

        def run_button():
            t = time.perf_counter()
            s = d.create(ttl_seconds=60)
            assert d.put_file(s, "/workspace/main.py", b"print(sum(range(10**5)))").status == 204
            r = d.exec(s, argv=["python3", "/workspace/main.py"])
            assert r["stdout"] == "4999950000\n", r
            d.delete(s)
            return (time.perf_counter() - t) * 1000
        rb1 = [run_button() for _ in range(max(5, N // 2))]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            rb8 = list(pool.map(lambda _: run_button(), range(max(16, N))))

        print(f"\nHatchery benchmark, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, runsc systrap\n")
        print(f"| {'operation':<44} | {'n':>4} | {'p50 ms':>8} | {'p99 ms':>8} | {'vs base':>8} |")
        print(f"|{'-' * 46}|{'-' * 6}|{'-' * 10}|{'-' * 10}|{'-' * 10}|")
        results += [
            row("baseline: runsc exec /bin/true", base_exec_true),
            row("hatchery: exec true (HTTP round trip)", h_true, base_exec_true),
            row("baseline: runsc exec python3 -c print(1)", base_exec_py),
            row("hatchery: exec python3 -c print(1)", h_py, base_exec_py),
            row("baseline: runsc run python3 (cold, to exit)", base_run),
            row("hatchery: create, cold (API -> agent ready)", h_create, base_run),
            row("hatchery: run button, 1 client", rb1, base_run),
            row("hatchery: run button, 8 concurrent clients", rb8, base_run),
        ]
        out = os.environ.get("BENCH_JSON")
        if out:
            json.dump(results, open(out, "w"), indent=2)
    finally:
        raw.close()
        d.cleanup()


if __name__ == "__main__":
    main()
