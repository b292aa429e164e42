"""Runs a command against live daemons, for suites that cannot start one
themselves (the TypeScript SDK's). Usage: with_daemon.py CMD [ARGS...]

Starts, on private ports and data dirs:
  - the main daemon on a private copy of the default template
    (HATCHERY_URL, HATCHERY_API_KEY, HATCHERY_TEST_TEMPLATES_DIR,
    HATCHERY_TEST_MAX_FILE_BYTES),
  - a daemon capped at one sandbox, for 503 capacity (HATCHERY_TEST_CAPPED_URL),
  - the test proxy in front of the main one (HATCHERY_TEST_PROXY_URL).
Afterwards fails if any sandbox is still listed or anything of one is left
on the host, whatever the command's own result."""

import os
import subprocess
import sys

import support


def main(argv):
    if not argv:
        sys.exit(__doc__)
    tdir = support.private_templates()
    daemons = []
    proxy = None
    rc = 1
    try:
        main_d = support.start_daemon(templates_dir=tdir)
        daemons.append(main_d)
        capped = support.start_daemon(["--max-sandboxes", "1"], bake=False)
        daemons.append(capped)
        proxy = support.Proxy(main_d.port)
        env = dict(os.environ, HATCHERY_URL=f"http://127.0.0.1:{main_d.port}", HATCHERY_API_KEY=support.KEY,
                   HATCHERY_TEST_TEMPLATES_DIR=tdir, HATCHERY_TEST_MAX_FILE_BYTES=str(support.MAX_FILE_BYTES),
                   HATCHERY_TEST_CAPPED_URL=f"http://127.0.0.1:{capped.port}", HATCHERY_TEST_PROXY_URL=proxy.url)
        rc = subprocess.run(argv, env=env).returncode
    finally:
        if proxy:
            proxy.close()
        problems = []
        for d in daemons:
            try:
                support.stop_daemon(d)
            except AssertionError as e:
                problems.append(str(e))
        support.remove_templates(tdir)
        for p in problems:
            print(f"with_daemon: {p}", file=sys.stderr)
        if problems:
            rc = rc or 1
    sys.exit(rc)


if __name__ == "__main__":
    main(sys.argv[1:])
