"""`hatchery audit verify` on an audit database written here by an
independent implementation of the documented format (docs/policy.md,
"Audit": canonical JSON, SHA-256 over prev_hash bytes + canonical event),
then edited, truncated and reordered with plain SQL. No daemon involved."""

import hashlib
import json
import os
import sqlite3
import subprocess
import tempfile

from cli import HATCHERY


def canonical(v):
    return json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def write_log(path, chains):
    db = sqlite3.connect(path)
    db.execute("""CREATE TABLE audit_events (chain TEXT NOT NULL, seq INTEGER NOT NULL, ts TEXT NOT NULL,
                  kind TEXT NOT NULL, data TEXT NOT NULL, prev_hash TEXT NOT NULL, hash TEXT NOT NULL,
                  PRIMARY KEY (chain, seq))""")
    for chain, n in chains.items():
        prev = bytes(32)
        for seq in range(1, n + 1):
            ev = {"chain": chain, "seq": seq, "ts": "2026-12-01T00:00:00Z", "kind": "tool_call",
                  "data": {"tool": "git_push", "args": {"branch": f"b{seq}"}, "note": "ünïcode \"q\"\n"}}
            h = hashlib.sha256(prev + canonical(ev).encode()).digest()
            db.execute("INSERT INTO audit_events VALUES (?,?,?,?,?,?,?)",
                       (chain, seq, ev["ts"], ev["kind"], json.dumps(ev["data"]), prev.hex(), h.hex()))
            prev = h
    db.commit()
    db.close()


def verify(*args):
    return subprocess.run([HATCHERY, "audit", "verify", *args], capture_output=True, text=True, timeout=60)


def test_audit_verify_finds_the_first_bad_seq():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "audit.db")
        write_log(path, {"ses_a": 30, "ses_b": 3})
        p = verify("--db", path)
        assert p.returncode == 0, (p.stdout, p.stderr)
        assert "ses_a: ok, 30 events" in p.stdout and "ses_b: ok, 3 events" in p.stdout, p.stdout

        db = sqlite3.connect(path)
        db.execute("""UPDATE audit_events SET data = '{"tool":"git_push","args":{"branch":"main"}}'
                      WHERE chain = 'ses_a' AND seq = 17""")
        db.commit()
        p = verify("--db", path, "ses_a")
        assert p.returncode == 3, (p.stdout, p.stderr)
        assert "ses_a: BAD at seq 17: hash_mismatch (16 events verified" in p.stdout, p.stdout
        p = verify("--db", path, "ses_b", "--json")
        assert p.returncode == 0 and json.loads(p.stdout)["verified"] == 3, p.stdout

        db.execute("DELETE FROM audit_events WHERE chain = 'ses_b' AND seq = 2")
        db.commit()
        p = verify("--db", path, "--json")
        reports = {r["chain"]: r for r in map(json.loads, p.stdout.splitlines())}
        assert p.returncode == 3
        assert reports["ses_b"]["first_bad"] == {"seq": 2, "reason": "seq_gap", "found": 3}, reports
        assert reports["ses_a"]["first_bad"]["seq"] == 17

        p = verify("--db", os.path.join(d, "missing.db"))
        assert p.returncode == 1 and "no such file" in p.stderr, p.stderr
