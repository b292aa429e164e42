"""Hatchery's built-in test runner for interview rounds (grader sandboxes
only; candidates never see this file or the tests).

    python3 run_tests.py --tests DIR --out REPORT.json --cpu-limit-ms N

Two parts, so the candidate's code never holds what decides the grade:

- The supervisor (this process, root) finds the cases by reading the test
  files' syntax (top-level `def test_*`), without importing anything, so
  the candidate's code cannot hide, add or rename a case. It runs each
  case in a fresh worker process, measures the worker's CPU time itself
  (wait4), and alone writes the report into a directory only root may
  enter.
- A worker (`--case FILE NAME`) drops to an unprivileged uid, imports one
  test module (which imports the candidate's solution from the work dir),
  runs one `test_*` function under the round's CPU limit (ITIMER_PROF for
  milliseconds, RLIMIT_CPU as the kernel's backstop) and tells the
  supervisor how it went over a pipe.

What the candidate's code can still do is what any in-process grader
allows: fake the outcome of the case it runs in (an object whose __eq__
always says yes, an `os._exit` from inside). It cannot write the report,
change another case, change the number of cases, or undercount its CPU
time. Cases also no longer share a process, so one case's state (or
crash) cannot reach the next.

The report is {"passed", "total", "cases": [{"name", "ok", "detail",
"cpu_ms", "wall_ms"}]}; the daemon recounts it from the cases."""

import argparse
import ast
import importlib.util
import json
import math
import os
import resource
import select
import signal
import subprocess
import sys
import time
import traceback

# The uid/gid the candidate's code runs as (nobody): it owns the work dir
# and nothing else.
CANDIDATE_UID = 65534
# One worker's message is a case's detail plus a little; more is refused.
MAX_MESSAGE = 64 << 10
# Processes the candidate's uid may have at once during a case.
MAX_PROCESSES = 256
# How long a worker that closed its pipe may take to exit.
EXIT_GRACE_S = 2.0


class CaseTimeLimit(BaseException):
    """BaseException, so a candidate's `except Exception` cannot eat it."""


def _on_prof(signum, frame):
    raise CaseTimeLimit()


def detail_of(exc):
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return "".join(tb)[-4000:]


def cases_in(path):
    """Top-level test functions of one file, by name, from its syntax."""
    with open(path, "rb") as fh:
        tree = ast.parse(fh.read(), filename=path)
    return sorted({
        n.name for n in tree.body
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test_")
    })


def drop_privileges():
    os.setgroups([])
    os.setgid(CANDIDATE_UID)
    os.setuid(CANDIDATE_UID)


def hand_over(workdir):
    """The work dir belongs to the candidate's uid (tests may write
    there); the tests and the report stay root's."""
    for root, dirs, names in os.walk(workdir):
        for n in [root] + [os.path.join(root, x) for x in dirs + names]:
            try:
                os.lchown(n, CANDIDATE_UID, CANDIDATE_UID)
            except OSError:
                pass


def readable(tests):
    """The tests are read by the worker's uid: readable, never writable."""
    for root, _dirs, names in os.walk(tests):
        os.chown(root, 0, 0)
        os.chmod(root, 0o755)
        for n in names:
            os.chown(os.path.join(root, n), 0, 0)
            os.chmod(os.path.join(root, n), 0o644)


def run_case(path, name, cpu_limit_ms, result_fd):
    """Worker: one case, as the candidate's uid."""
    out = os.fdopen(result_fd, "w")
    drop_privileges()
    if cpu_limit_ms > 0:
        # SIGXCPU a second past the limit, SIGKILL a second later.
        soft = math.ceil(cpu_limit_ms / 1000) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 1))
    # A fork bomb in the candidate's code stays small (never raised past
    # what the sandbox already allows).
    _, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    n = MAX_PROCESSES if hard == resource.RLIM_INFINITY else min(hard, MAX_PROCESSES)
    resource.setrlimit(resource.RLIMIT_NPROC, (n, n))
    sys.path.insert(0, os.getcwd())
    signal.signal(signal.SIGPROF, _on_prof)
    msg = {"ok": False, "detail": "", "setup_cpu_ms": 0.0}
    try:
        spec = importlib.util.spec_from_file_location("hatchery_hidden", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["hatchery_hidden"] = mod
        spec.loader.exec_module(mod)
        fn = getattr(mod, name)
        msg["setup_cpu_ms"] = time.process_time() * 1000
        if cpu_limit_ms > 0:
            signal.setitimer(signal.ITIMER_PROF, cpu_limit_ms / 1000.0)
        fn()
        signal.setitimer(signal.ITIMER_PROF, 0)
        msg["ok"] = True
    except CaseTimeLimit:
        msg["detail"] = f"time limit: over {cpu_limit_ms} ms of CPU"
    except BaseException as e:
        signal.setitimer(signal.ITIMER_PROF, 0)
        msg["detail"] = detail_of(e)
    out.write(json.dumps(msg))
    out.flush()
    os._exit(0)


def candidate_pids():
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/status") as fh:
                for line in fh:
                    if line.startswith("Uid:"):
                        if CANDIDATE_UID in map(int, line.split()[1:]):
                            pids.append(int(d))
                        break
        except (OSError, ValueError):
            pass
    return pids


def kill_candidate_processes():
    """Nothing the candidate's code started (a daemonized child included)
    outlives its case, so none can reach the next case's worker."""
    for _ in range(50):
        pids = candidate_pids()
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.01)


def worker_exited(pid):
    """Whether the worker has exited, without reaping it (its rusage is
    read by wait4 afterwards)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def supervise(path, name, cpu_limit_ms):
    """Runs one case in a worker; the verdict on time is the supervisor's."""
    r, w = os.pipe()
    w0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--case", path, name,
         "--cpu-limit-ms", str(cpu_limit_ms), "--result-fd", str(w)],
        pass_fds=(w,), cwd=os.getcwd(), start_new_session=True,
    )
    os.close(w)
    os.set_blocking(r, False)
    chunks, size = [], 0
    # Read until the pipe ends or the worker is gone (a child of its that
    # kept the pipe open must not hold the supervisor).
    while size <= MAX_MESSAGE:
        gone = worker_exited(proc.pid)
        select.select([r], [], [], 0.05)
        try:
            b = os.read(r, 65536)
        except BlockingIOError:
            b = None
        if b:
            chunks.append(b)
            size += len(b)
            continue
        if b == b"" or gone:
            break
    os.close(r)
    # A worker that said its piece exits at once; one that closed the pipe
    # and went on is given a moment.
    deadline = time.monotonic() + EXIT_GRACE_S
    while not worker_exited(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    # Whatever the worker left running goes with it.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = status
    kill_candidate_processes()
    wall_ms = (time.monotonic() - w0) * 1000
    total_cpu_ms = (usage.ru_utime + usage.ru_stime) * 1000
    try:
        msg = json.loads(b"".join(chunks)) if size <= MAX_MESSAGE else None
    except ValueError:
        msg = None
    if not isinstance(msg, dict):
        msg = None
    setup = 0.0
    if msg is not None:
        try:
            # Only the import before the call is left out of the case's
            # time; a worker cannot claim more than it used.
            setup = min(max(float(msg.get("setup_cpu_ms", 0.0)), 0.0), total_cpu_ms)
        except (TypeError, ValueError):
            setup = 0.0
    cpu_ms = total_cpu_ms - setup
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGXCPU and msg is None:
        ok, detail = False, f"time limit: over {cpu_limit_ms} ms of CPU"
    elif msg is None:
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)
        ok, detail = False, f"the case ended without a result (exit {code})"
    else:
        ok, detail = msg.get("ok") is True, str(msg.get("detail", ""))[-4000:]
    if cpu_limit_ms > 0 and cpu_ms > cpu_limit_ms:
        ok, detail = False, f"time limit: over {cpu_limit_ms} ms of CPU"
    return {"name": name, "ok": ok, "detail": detail,
            "cpu_ms": round(cpu_ms, 3), "wall_ms": round(wall_ms, 3)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tests")
    ap.add_argument("--out")
    ap.add_argument("--cpu-limit-ms", type=int, default=0)
    ap.add_argument("--case", nargs=2, metavar=("FILE", "NAME"))
    ap.add_argument("--result-fd", type=int)
    args = ap.parse_args()
    if args.case:
        return run_case(args.case[0], args.case[1], args.cpu_limit_ms, args.result_fd)
    if not args.tests or not args.out:
        ap.error("--tests and --out are required")
    out_path = os.path.abspath(args.out)
    os.makedirs(os.path.dirname(out_path), mode=0o700, exist_ok=True)
    os.chmod(os.path.dirname(out_path), 0o700)
    hand_over(os.getcwd())
    readable(args.tests)
    files = []
    for root, _dirs, names in os.walk(args.tests):
        for n in names:
            if n.endswith(".py"):
                files.append(os.path.join(root, n))
    files.sort()
    found = []
    cases = []
    for f in files:
        stem = os.path.splitext(os.path.relpath(f, args.tests))[0].replace(os.sep, ".")
        try:
            names = cases_in(f)
        except (SyntaxError, ValueError, OSError) as e:
            cases.append({"name": stem, "ok": False, "detail": detail_of(e), "cpu_ms": 0.0, "wall_ms": 0.0})
            continue
        found.extend((stem, f, n) for n in names)
    dup = {}
    for _, _, n in found:
        dup[n] = dup.get(n, 0) + 1
    for stem, f, n in found:
        c = supervise(f, n, args.cpu_limit_ms)
        if dup[n] > 1:
            c["name"] = f"{stem}.{n}"
        cases.append(c)
    report = {"passed": sum(1 for c in cases if c["ok"]), "total": len(cases), "cases": cases}
    with open(out_path, "w") as fh:
        json.dump(report, fh)


if __name__ == "__main__":
    main()
