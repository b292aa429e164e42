"""Hatchery's built-in test runner for interview rounds (grader sandboxes
only; candidates never see this file or the tests).

    python3 run_tests.py --tests DIR --out REPORT.json --cpu-limit-ms N

Imports every `*.py` under DIR, runs each top-level `test_*` function in
name order with the candidate's work dir on sys.path, and writes
{"passed", "total", "cases": [{"name", "ok", "detail", "cpu_ms", "wall_ms"}]}.
Each case gets the round's CPU limit (ITIMER_PROF, which counts this
process's CPU time); a case over it fails with "time limit". A crash in
one case does not stop the others."""

import argparse
import importlib.util
import json
import os
import signal
import sys
import time
import traceback


class CaseTimeLimit(BaseException):
    """BaseException, so a candidate's `except Exception` cannot eat it."""


def _on_prof(signum, frame):
    raise CaseTimeLimit()


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def detail_of(exc):
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    text = "".join(tb)
    return text[-4000:]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tests", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--cpu-limit-ms", type=int, default=0)
    args = ap.parse_args()
    out_path = os.path.abspath(args.out)
    sys.path.insert(0, os.getcwd())
    signal.signal(signal.SIGPROF, _on_prof)
    files = []
    for root, _dirs, names in os.walk(args.tests):
        for n in names:
            if n.endswith(".py"):
                files.append(os.path.join(root, n))
    files.sort()
    cases = []
    tests = []
    for i, f in enumerate(files):
        stem = os.path.splitext(os.path.relpath(f, args.tests))[0].replace(os.sep, ".")
        try:
            mod = load(f, f"hatchery_hidden_{i}")
        except BaseException as e:  # the module itself (or its import of the solution) failed
            cases.append({"name": stem, "ok": False, "detail": detail_of(e), "cpu_ms": 0.0, "wall_ms": 0.0})
            continue
        for name in sorted(dir(mod)):
            fn = getattr(mod, name)
            if name.startswith("test_") and callable(fn):
                tests.append((stem, name, fn))
    dup = {}
    for stem, name, _ in tests:
        dup[name] = dup.get(name, 0) + 1
    limit_s = args.cpu_limit_ms / 1000.0
    for stem, name, fn in tests:
        label = name if dup[name] == 1 else f"{stem}.{name}"
        c0, w0 = time.process_time(), time.monotonic()
        ok, detail = True, ""
        try:
            if limit_s > 0:
                signal.setitimer(signal.ITIMER_PROF, limit_s)
            fn()
        except CaseTimeLimit:
            ok, detail = False, f"time limit: over {args.cpu_limit_ms} ms of CPU"
        except BaseException as e:
            ok, detail = False, detail_of(e)
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
        cases.append({
            "name": label,
            "ok": ok,
            "detail": detail,
            "cpu_ms": round((time.process_time() - c0) * 1000, 3),
            "wall_ms": round((time.monotonic() - w0) * 1000, 3),
        })
    report = {"passed": sum(1 for c in cases if c["ok"]), "total": len(cases), "cases": cases}
    with open(out_path, "w") as fh:
        json.dump(report, fh)


if __name__ == "__main__":
    main()
