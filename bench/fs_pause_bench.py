#!/usr/bin/env python3
"""Filesystem-only pause and resume (issue 35) against a memory pause, on one
daemon, through the v1 API as the E2B adapter does them: a pause is a
snapshot (`"memory": false`, or a checkpoint) then the sandbox's delete; a
resume is a fork of that snapshot (boot_mode `files`: the template's
checkpoint plus the files unpacked; or `fork`: the checkpoint restored)
until it answers an exec. The sandbox holds a few small files written by
the test (the usual case: a workspace, not a disk full). BENCH_FS_N rounds
(default 10). All traffic on 127.0.0.1."""

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "sdk"))

import support  # noqa: E402

N = int(os.environ.get("BENCH_FS_N", "10"))


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(p / 100 * (len(xs) - 1)))))]


def row(name, xs, base=None):
    p50, p99 = pct(xs, 50), pct(xs, 99)
    ratio = f"{p50 / pct(base, 50):.2f}x" if base else ""
    print(f"| {name:<44} | {len(xs):>4} | {p50:>8.1f} | {p99:>8.1f} | {ratio:>8} |", flush=True)


def rounds(d, memory):
    """`N` pause/resume rounds of one sandbox's lineage; (pauses, resumes)
    in ms and the images' sizes in bytes."""
    sid = d.create(ttl_seconds=600)
    d.exec(sid, "mkdir -p /workspace/src && for i in $(seq 20); do echo line $i > /workspace/src/f$i.py; done")
    pauses, resumes, sizes = [], [], []
    for i in range(N):
        d.exec(sid, f"echo round {i} > /workspace/round")
        t0 = time.monotonic()
        r = d.request("POST", f"/v1/sandboxes/{sid}/snapshots", {"memory": memory})
        assert r.status == 201, r
        snap = r.json()["id"]
        sizes.append(r.json()["size_bytes"])
        assert d.request("DELETE", f"/v1/sandboxes/{sid}").status == 204
        t1 = time.monotonic()
        r = d.request("POST", f"/v1/snapshots/{snap}/fork", {"ttl_seconds": 600})
        assert r.status == 201, r
        sid = r.json()["sandboxes"][0]["id"]
        d.created.add(sid)
        assert d.exec(sid, "cat /workspace/round")["stdout"] == f"round {i}\n"
        t2 = time.monotonic()
        assert d.request("DELETE", f"/v1/snapshots/{snap}").status == 204
        pauses.append((t1 - t0) * 1000)
        resumes.append((t2 - t1) * 1000)
    d.request("DELETE", f"/v1/sandboxes/{sid}")
    return pauses, resumes, sizes


def main():
    d = support.start_daemon()
    try:
        mem_p, mem_r, mem_s = rounds(d, True)
        fs_p, fs_r, fs_s = rounds(d, False)
    finally:
        support.stop_daemon(d)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    print("| pause / resume (ms)                          |    N |      p50 |      p99 | vs memory |")
    print("|---|---|---|---|---|")
    row("memory pause (checkpoint + delete)", mem_p)
    row("filesystem-only pause (export + delete)", fs_p, mem_p)
    row("memory resume (fork, first exec)", mem_r)
    row("filesystem-only resume (files fork, exec)", fs_r, mem_r)
    print(f"image size p50: memory {pct(mem_s, 50)} bytes, filesystem-only {pct(fs_s, 50)} bytes")


if __name__ == "__main__":
    main()
