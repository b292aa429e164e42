#!/usr/bin/env python3
"""Runs the suites of `make test` and ends with a table: each suite, its
test count, its wall time, and the total (docs/testing.md).

    tests/run_suites.py SUITE... [// SUITE...]     # each SUITE is a make target

`//` splits the suites into two lanes that run side by side, each one
suite after another (most of a suite's time is waiting on sandboxes,
servers and timers, not CPU). A lane's suites get HATCHERY_TEST_LANE=<n>,
so their daemons draw network ranges from disjoint halves (harness.py).
With lanes, each suite's output goes to target/test-logs/<suite>.log and
is printed whole when the suite ends; with one lane it streams.

Every suite runs even if an earlier one failed (one CI run reports every
red suite, not the first); the exit status is non-zero if any failed. The
table is also written to $HATCHERY_TEST_TIMES (default
target/test-times.md) for closing notes and CI logs.
"""

import os
import re
import subprocess
import sys
import threading
import time

# Summary lines of the runners the suites use: pytest ("3 passed, 1 skipped
# in 2.1s"), cargo test ("test result: ok. 12 passed; 0 failed; 1 ignored"),
# node's test runner ("# pass 12" / "# fail 0").
PYTEST = re.compile(r"^=*\s*((?:\d+ (?:passed|failed|skipped|errors?|xfailed|xpassed|deselected)(?:, )?)+) in [\d.]+s")
PYTEST_PART = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)")
CARGO = re.compile(r"^test result: \w+\. (\d+) passed; (\d+) failed; (\d+) ignored")
NODE = re.compile(r"^# (pass|fail|skipped) (\d+)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def count(lines):
    """(passed, failed, skipped) over every runner summary in the output;
    None when no runner printed one (fmt, clippy, bundle checks)."""
    n = [0, 0, 0]
    seen = False
    for raw in lines:
        line = ANSI.sub("", raw).strip()
        m = PYTEST.match(line)
        if m:
            seen = True
            for k, what in PYTEST_PART.findall(m.group(1)):
                i = 0 if what in ("passed", "xfailed", "xpassed") else 2 if what == "skipped" else 1
                n[i] += int(k)
            continue
        m = CARGO.match(line)
        if m:
            seen = True
            n[0] += int(m.group(1))
            n[1] += int(m.group(2))
            n[2] += int(m.group(3))
            continue
        m = NODE.match(line)
        if m:
            seen = True
            n[{"pass": 0, "fail": 1, "skipped": 2}[m.group(1)]] += int(m.group(2))
    return tuple(n) if seen else None


def fmt_time(s):
    m, s = divmod(int(round(s)), 60)
    return f"{m}:{s:02d}"


PRINT = threading.Lock()
LOGS = "target/test-logs"


def run(suite, lane, live):
    """Runs `make SUITE`; returns (ok, counts, seconds). Live: its output
    streams through; otherwise it is kept in a log, printed at the end."""
    start = time.monotonic()
    # Unbuffered, so a suite's log can be followed while it runs.
    env = dict(os.environ, HATCHERY_TEST_LANE=str(lane), PYTHONUNBUFFERED="1")
    os.makedirs(LOGS, exist_ok=True)
    log_path = os.path.join(LOGS, suite + ".log")
    proc = subprocess.Popen(
        ["make", "--no-print-directory", "SUITE_PREREQS=", "SUITE_BUILD=", suite],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=0, env=env)
    lines, buf = [], b""
    with open(log_path, "wb") as log:
        while True:
            chunk = proc.stdout.read(65536)
            if not chunk:
                break
            log.write(chunk)
            log.flush()
            if live:
                sys.stdout.buffer.write(chunk)
                sys.stdout.flush()
            buf += chunk
            *done, buf = buf.split(b"\n")
            lines.extend(d.decode(errors="replace") for d in done)
    if buf:
        lines.append(buf.decode(errors="replace"))
    rc = proc.wait()
    ok, secs = rc == 0, time.monotonic() - start
    with PRINT:
        if not live:
            print(f"\n=== {suite} (lane {lane}) output ===", flush=True)
            sys.stdout.buffer.write(open(log_path, "rb").read())
        print(f"=== {suite}: {'ok' if ok else 'FAILED'} in {fmt_time(secs)} ===", flush=True)
    return ok, count(lines), secs


def lane(n, suites, live, rows):
    for suite in suites:
        with PRINT:
            print(f"\n=== {suite} (lane {n}) started at +{fmt_time(time.monotonic() - START)} ===", flush=True)
        ok, c, secs = run(suite, n, live)
        rows.append((suite, ok, c, secs, n))


def table(rows, total):
    out = ["| suite | lane | passed | failed | skipped | wall | result |", "|---|---:|---:|---:|---:|---:|---|"]
    sums = [0, 0, 0]
    for suite, ok, n, secs, lane_no in rows:
        cells = [str(x) for x in n] if n else ["-", "-", "-"]
        if n:
            sums = [a + b for a, b in zip(sums, n)]
        out.append(f"| {suite} | {lane_no} | {' | '.join(cells)} | {fmt_time(secs)} | {'ok' if ok else 'FAILED'} |")
    failed = [r[0] for r in rows if not r[1]]
    out.append(f"| **total (wall)** | | {sums[0]} | {sums[1]} | {sums[2]} | {fmt_time(total)} | "
               f"{'ok' if not failed else 'FAILED: ' + ', '.join(failed)} |")
    return "\n".join(out)


START = time.monotonic()


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    lanes = [[]]
    for a in args:
        if a == "//":
            lanes.append([])
        else:
            lanes[-1].append(a)
    lanes = [ln for ln in lanes if ln]
    live = len(lanes) == 1
    rows = []
    threads = [threading.Thread(target=lane, args=(i, ln, live, rows)) for i, ln in enumerate(lanes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    order = [a for a in args if a != "//"]
    rows.sort(key=lambda r: order.index(r[0]))
    t = table(rows, time.monotonic() - START)
    print("\n" + t, flush=True)
    path = os.environ.get("HATCHERY_TEST_TIMES", "target/test-times.md")
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as f:
            f.write(t + "\n")
    except OSError as e:
        print(f"run_suites: could not write {path}: {e}", file=sys.stderr)
    sys.exit(0 if all(r[1] for r in rows) else 1)


if __name__ == "__main__":
    main()
