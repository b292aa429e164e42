#!/usr/bin/env python3
"""CPU by kind of process over a window: python3 bench/cpu_by_process.py SECONDS [LABEL]
(run beside a bench, e.g. room_bench while it types; docs/benchmarks.md).
Classifies every process by its command line (hatcheryd, runsc sandbox =
the Sentry, runsc gofer, other runsc, the shim, the bench's python, other)
and prints CPU-seconds per second (1.0 = one core) over the window."""
import os, sys, time
HZ = os.sysconf("SC_CLK_TCK")

def kind(cmd):
    j = " ".join(cmd)
    if os.path.basename(cmd[0]) == "hatcheryd":
        return "hatcheryd"
    if "runsc" in j:
        if " boot" in j or "runsc-sandbox" in j:
            return "runsc-sentry"
        if " gofer" in j:
            return "runsc-gofer"
        return "runsc-other"
    if "hatchery-shim" in j or "shim" in (cmd[0] if cmd else ""):
        return "shim"
    if "room_bench" in j:
        return "bench-client"
    if "python" in j:
        return "python-other"
    if "cargo" in j or "rustc" in j:
        return "cargo/rustc"
    return "other"

def snap():
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                st = f.read()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = [c.decode(errors="replace") for c in f.read().split(b"\0") if c]
        except OSError:
            continue
        rest = st[st.rindex(")") + 2:].split()
        t = int(rest[11]) + int(rest[12])  # utime + stime
        comm = st[st.index("(") + 1:st.rindex(")")]
        out[pid] = (t, kind(cmd) if cmd else "kernel:" + comm.split("/")[0])
    return out

def stat_cpu():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return v

w = float(sys.argv[1]); label = sys.argv[2] if len(sys.argv) > 2 else ""
a, ca, t0 = snap(), stat_cpu(), time.monotonic()
time.sleep(w)
b, cb, t1 = snap(), stat_cpu(), time.monotonic()
dt = t1 - t0
agg, n = {}, {}
for pid, (t, k) in b.items():
    d = t - a.get(pid, (0, k))[0] if pid in a else t
    agg[k] = agg.get(k, 0) + d
    n[k] = n.get(k, 0) + 1
tot = [y - x for x, y in zip(ca, cb)]
busy = sum(tot) - tot[3] - tot[4]
print(f"== {label} window {dt:.1f}s load {os.getloadavg()[0]:.1f}; machine busy {busy / sum(tot) * 100:.0f}% "
      f"(user {(tot[0] + tot[1]) / sum(tot) * 100:.0f}% sys {tot[2] / sum(tot) * 100:.0f}%)")
for k, v in sorted(agg.items(), key=lambda kv: -kv[1]):
    if v:
        print(f"  {k:16s} {v / HZ / dt:6.3f} cores  ({n[k]} procs)")
