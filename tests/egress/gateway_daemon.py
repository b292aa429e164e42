"""The egress suite's daemon: sessions whose model calls go through the
in-process gateway to a scripted model (the model is reachable only
through the gateway), with prices and an upstream key in files of its own."""

import contextlib
import json
import os
import shutil
import subprocess
import tempfile

from harness import Daemon, arg
from sessions_support import SessionDaemon

CHEAP = {"models": {"scripted": {"input_cents_per_mtok": 1, "output_cents_per_mtok": 1}}}


@contextlib.contextmanager
def gateway_daemon(model, templates_dir, prefix, prices=CHEAP, upstream_key="sk-unused", extra=()):
    tmp = tempfile.mkdtemp(prefix=prefix)
    pf = os.path.join(tmp, "prices.json")
    with open(pf, "w") as f:
        json.dump(prices, f)
    keyf = os.path.join(tmp, "upstream_key")
    with open(keyf, "w") as f:
        f.write(upstream_key)
    d = SessionDaemon.__new__(SessionDaemon)
    Daemon.__init__(d, extra_args=[
        "--max-ttl", "7200", "--pool-size", "1",
        "--gateway-openai-upstream", f"http://127.0.0.1:{model.port}",
        "--gateway-prices", pf, "--gateway-upstream-key-file", keyf,
        "--sessions-model", "scripted", *extra,
    ], templates_dir=templates_dir)
    d.start()
    try:
        yield d
    finally:
        d.cleanup_sessions()
        shutil.rmtree(tmp, ignore_errors=True)


def verify_chain(d, sid):
    """`hatchery audit verify` accepts session `sid`'s hash chain; returns
    its report (`verified`, `head` {`seq`, `hash`}), so a caller can check
    that the events it cares about are within the verified chain."""
    cli = os.path.join(os.environ["HATCHERY_BIN_DIR"], "hatchery")
    db = arg(d.extra_args, "--db") or os.path.join(d.data_dir, "hatchery.db")
    r = subprocess.run([cli, "audit", "verify", "--db", db, sid, "--json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, (r.stdout, r.stderr)
    report = json.loads(r.stdout)
    assert report["chain"] == sid and report["first_bad"] is None and report["head"], report
    return report
