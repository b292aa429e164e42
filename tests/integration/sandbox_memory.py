"""What one sandbox costs the host in memory: the PSS of each of its
processes (shim, Sentry, gofer, and one systrap stub per guest address
space), every address space counted once. Used by bench/bench.py's density
figure and by test_density.py.

Why "once": the shim's command line names the sandbox, and so do the
Sentry's and the gofer's, which are the shim's children. Counting "every
process naming the sandbox, plus its children" (bench.py before
2026-12-07) counted the Sentry and the gofer twice, about 28 MiB of the 56
it reported. A stub's own children are clones sharing its address space
(CLONE_VM): their smaps_rollup is the stub's again."""

import ctypes
import os

ROLES = ("shim", "sentry", "gofer", "stubs")
FIELDS = ("Pss", "Pss_Anon", "Pss_File", "Pss_Shmem")
_libc = ctypes.CDLL(None, use_errno=True)
_SYS_KCMP, _KCMP_VM = 312, 1  # x86_64


def rollup_kb(pid):
    """{field: kB} from /proc/PID/smaps_rollup; {} if the process is gone."""
    out = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in FIELDS:
                    out[key] = int(rest.split()[0])
    except OSError:
        pass
    return out


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _children(pid):
    out = []
    try:
        for t in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{t}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def same_address_space(a, b):
    """kcmp(KCMP_VM): whether two processes share one mm."""
    return _libc.syscall(_SYS_KCMP, a, b, _KCMP_VM, 0, 0) == 0


def processes(sid):
    """{role: [pids]} of sandbox `sid`, each address space once."""
    found = {r: [] for r in ROLES}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        cmd = _cmdline(p)
        if sid.encode() not in cmd:
            continue
        exe = cmd.split(b"\0")[0]
        role = ("sentry" if b"runsc-sandbox" in exe else "gofer" if b"runsc-gofer" in exe
                else "shim" if b"hatchery-shim" in exe else None)
        if role:
            found[role].append(int(p))
    todo = [c for s in found["sentry"] for c in _children(s)]
    while todo:
        p = todo.pop()
        todo += _children(p)
        if not any(same_address_space(p, q) for q in found["stubs"]):
            found["stubs"].append(p)
    return found


def sandbox_memory_kb(sid):
    """{role: {field: kB}} for sandbox `sid`, plus "total"."""
    out = {r: dict.fromkeys(FIELDS, 0) for r in (*ROLES, "total")}
    for role, pids in processes(sid).items():
        for p in pids:
            for k, v in rollup_kb(p).items():
                out[role][k] += v
                out["total"][k] += v
    return out


def sandbox_pss_mb(sid):
    """PSS of everything on the host that belongs to one sandbox, in MiB."""
    return sandbox_memory_kb(sid)["total"]["Pss"] / 1024
