#!/usr/bin/env python3
"""`make bench-code`: the Run-button path on its own, quickly. run_code in a
pooled sandbox (the interpreter already running) against the raw
`runsc exec python3 -c` baseline and Hatchery's own exec, measured in one
run; plus the cost of exec units (exec true) and what cpu_ms reports. The
same rows are in `make bench`; this runs in about a minute."""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from bench import N, RawRunsc, code_first_output, metric, row, table_header, timed, wait_for  # noqa: E402
from harness import Daemon  # noqa: E402

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.0: pass"
# The whole process uses 1.0 s of CPU, its start-up included.
BURN_TOTAL = "import time\nwhile time.process_time() < 1.0: pass"


def main():
    raw = RawRunsc()
    d = Daemon(extra_args=["--max-sandboxes", "40", "--pool-size", "4"]).start()
    try:
        wait_for(lambda: metric(d, "hatchery_pool_ready") >= 4)
        cid = raw.start_idle()
        base_true = timed(lambda: raw.runsc("exec", cid, "/bin/true", check=True), N)
        base_py = timed(lambda: raw.runsc("exec", cid, "python3", "-c", "print(1)", check=True), N)
        sid = d.create(ttl_seconds=600)
        d.exec(sid, "true")
        h_true = timed(lambda: d.exec(sid, argv=["true"]), N * 2)
        h_py = timed(lambda: d.exec(sid, argv=["python3", "-c", "print(1)"]), N)

        first = [code_first_output(d, False) for _ in range(N)]
        first_create = [code_first_output(d, True) for _ in range(N)]
        again = timed(lambda: d.request("POST", f"/v1/sandboxes/{sid}/code", {"code": "print('hi')"}), N * 2)
        cpu_code = [d.request("POST", f"/v1/sandboxes/{sid}/code", {"code": BURN}).json()["cpu_ms"] for _ in range(3)]
        cpu_exec = [d.exec(sid, f"setsid python3 -c '{BURN_TOTAL}' & wait", timeout_seconds=30)["cpu_ms"] for _ in range(3)]

        print(f"\nrun_code benchmark, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, runsc systrap, N={N}")
        table_header("Exec and run_code (baselines: runsc exec in an idle container)")
        row("baseline: runsc exec /bin/true", base_true)
        row("hatchery: exec true (HTTP, in its own unit)", h_true, base_true)
        row("baseline: runsc exec python3 -c print(1)", base_py)
        row("hatchery: exec python3 -c print(1)", h_py, base_py)
        row("hatchery: run_code print, first output", first, base_py)
        row("hatchery: create + run_code, first output", first_create, base_py)
        row("hatchery: run_code print, answer (warm ctx)", again, base_py)
        print(f"\ncpu_ms reported for a 1.0 s CPU burner: run_code {cpu_code}, "
              f"exec with the burner setsid'd away {cpu_exec}")
    finally:
        raw.close()
        d.cleanup()


if __name__ == "__main__":
    main()
