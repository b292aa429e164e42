"""Upgrade in place from a real data dir of the previous release (issue 32,
item 3): tests/fixtures/datadir-e1cedfa/ holds the SQLite files a daemon
of commit e1cedfa wrote (state.db, policies.db, sessions.db, rounds.db,
broker.db, gateway.db; what is in them: its README.md and fixture.json,
made by tests/fixtures/make_datadir_e1cedfa.py). The current daemon
starts on a copy, imports them into DATA_DIR/hatchery.db, and serves
every sandbox record, policy version, agent session with its event chain
(`hatchery audit verify` passes, same heads), broker call, gateway budget
and interview round; a second start imports nothing again. SQLite only:
on PostgreSQL there is no file to import (the table renames are checked
by each product's own upgrade tests)."""

import json
import os
import shutil
import sqlite3
import subprocess
import tempfile
import time

import pytest

from harness import BIN_DIR, TEST_DB, Daemon, free_port

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "datadir-e1cedfa")
FILES = ["state.db", "policies.db", "sessions.db", "rounds.db", "broker.db", "gateway.db"]

# (old file, old table, new table, key columns, copied columns or None
# when the daemon may change the row after the import: then only the keys
# must all be there[, which old rows]).
TABLES = [
    ("state.db", "sandboxes", "core_sandboxes", ["id"], None),
    ("state.db", "events", "core_events", ["seq"], ["seq", "sandbox_id", "at_ms", "kind", "detail", "epoch"]),
    ("state.db", "snapshots", "core_snapshots", ["id"], None),
    ("state.db", "deployment_secrets", "core_secrets", ["name"], ["name", "value"]),
    # The built-in policy is the new daemon's own (written at open, the same
    # document): its old row is not copied, by design; compared by key.
    ("policies.db", "policies", "policy_heads", ["id"],
     ["id", "name", "latest_version", "builtin", "created_at", "updated_at"], "builtin = 0"),
    # Its latest version is this build's (pol_standard gains versions).
    ("policies.db", "policies", "policy_heads", ["id"], ["id", "builtin"], "builtin = 1"),
    ("policies.db", "policy_versions", "policy_versions", ["policy_id", "version"],
     ["policy_id", "version", "document", "sha256", "created_at"], "policy_id != 'pol_standard'"),
    ("policies.db", "policy_versions", "policy_versions", ["policy_id", "version"],
     ["policy_id", "version", "sha256"], "policy_id = 'pol_standard'"),
    ("sessions.db", "sessions", "sessions", ["id"], None),
    ("sessions.db", "events", "session_events", ["session_id", "seq"],
     ["session_id", "seq", "at", "actor", "type", "data", "prev_hash", "hash", "epoch"]),
    ("sessions.db", "blobs", "session_blobs", ["session_id", "ref"], ["session_id", "ref", "data"]),
    ("sessions.db", "approvals", "session_approvals", ["id"],
     ["id", "session_id", "action", "details", "state", "decision", "note", "created_at", "decided_at"]),
    ("broker.db", "calls", "broker_calls", ["session_id", "seq"],
     ["session_id", "seq", "epoch", "tool", "args_sha256", "args", "state", "decision", "rule_id",
      "approval_id", "event_seq", "result_event_seq", "effect", "output", "review_event_seq",
      "created_at", "updated_at", "runner"]),
    ("broker.db", "epochs", "broker_epochs", ["sandbox_id", "session_id"], None),
    ("gateway.db", "budgets", "gateway_budgets", ["scope"],
     ["scope", "limit_tokens", "limit_usd_cents", "used_tokens", "used_usd_cents"]),
    ("gateway.db", "settlements", "gateway_settlements", ["id"], ["id", "tokens", "usd_cents"]),
    ("gateway.db", "keys", "gateway_keys", ["hash"], None),
    ("gateway.db", "sandbox_bindings", "gateway_sandbox_bindings", ["sandbox"], None),
    ("rounds.db", "rounds", "rounds", ["id"], None),
    ("rounds.db", "sessions", "round_sessions", ["id"], None),
    ("rounds.db", "tokens", "round_tokens", ["hash"], None),
    ("rounds.db", "runs", "round_runs", ["id"], ["seq", "id", "session_id", "created_at_ms", "result"]),
    ("rounds.db", "submissions", "round_submissions", ["id"],
     ["seq", "id", "session_id", "round_id", "files", "sha256", "created_at_ms"]),
    ("rounds.db", "gradings", "round_gradings", ["id"],
     ["seq", "id", "submission_id", "created_at_ms", "status", "passed", "total", "report"]),
    ("rounds.db", "replays", "round_replays", ["id"], None),
]

pytestmark = pytest.mark.skipif(bool(TEST_DB), reason="upgrading a data dir's SQLite files: SQLite only")


def rows(path, table, cols, where="true"):
    c = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        q = ", ".join(f'"{x}"' for x in cols)
        return sorted(c.execute(f'SELECT {q} FROM "{table}" WHERE {where}').fetchall(), key=repr)
    finally:
        c.close()


def count(path, table):
    c = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return c.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]
    finally:
        c.close()


def audit_verify(db):
    r = subprocess.run([os.path.join(BIN_DIR, "hatchery"), "audit", "verify", "--db", db, "--json"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    return {x["chain"]: x for x in map(json.loads, r.stdout.splitlines())}


@pytest.fixture
def upgraded():
    """A current daemon on a copy of the fixture, with the flags that open
    every product's store (the gateway's needs an upstream: a closed port,
    never called)."""
    fx = json.load(open(os.path.join(FIXTURE, "fixture.json")))
    secrets = tempfile.mkdtemp(prefix="hxup-")
    prices = os.path.join(secrets, "prices.json")
    with open(prices, "w") as f:
        json.dump({"models": {"scripted": {"input_cents_per_mtok": 100000, "output_cents_per_mtok": 400000}}}, f)
    keyf = os.path.join(secrets, "upstream_key")
    with open(keyf, "w") as f:
        f.write("sk-upstream-unused-0123456789")
    d = Daemon(extra_args=["--pool-size", "0", "--max-ttl", "7200", "--sessions-model", "scripted",
                           "--gateway-openai-upstream", f"http://127.0.0.1:{free_port()}",
                           "--gateway-prices", prices, "--gateway-upstream-key-file", keyf])
    for name in FILES:
        shutil.copyfile(os.path.join(FIXTURE, name), os.path.join(d.data_dir, name))
    try:
        # Before the first start's reconcile, which judges the expiry.
        d.started_ms = int(time.time() * 1000)
        d.start()
        yield d, fx
    finally:
        try:
            d.cleanup()
        finally:
            shutil.rmtree(secrets, ignore_errors=True)


def check_api(d, fx):
    # Sandboxes: the one that ran when the old daemon stopped has no
    # process on this host (the fixture holds only its record), so the
    # start's reconcile stopped it (check_db reads the record); the API
    # serves only live sandboxes. The imported snapshots' records are served.
    kept = fx["sandboxes"]["kept"]
    r = d.request("GET", f"/v1/sandboxes/{kept}")
    assert r.status == 404 and r.error_code() == "sandbox_not_found", r
    for snap in fx["snapshots"]:
        r = d.request("GET", f"/v1/snapshots/{snap}")
        assert r.status == 200 and r.json()["id"] == snap, r
    # Policy: both versions, as written.
    pol = fx["policy"]
    r = d.request("GET", f"/v1/policies/{pol['id']}")
    assert r.status == 200 and r.json()["version"] == pol["versions"], r
    for v, doc in pol["documents"].items():
        r = d.request("GET", f"/v1/policies/{pol['id']}/versions/{v}")
        assert r.status == 200 and r.json()["document"] == doc, r
    # The agent session, its events, spend and broker calls.
    s = fx["session"]
    r = d.request("GET", f"/v1/sessions/{s['id']}")
    assert r.status == 200, r
    got = r.json()
    assert (got["state"], got["spend"], got["budget"]) == (s["state"], s["spend"], s["budget"]), got
    events, after = [], 0
    while True:
        p = d.request("GET", f"/v1/sessions/{s['id']}/events?after={after}&limit=1000").json()
        events += p["events"]
        if not p["has_more"]:
            break
        after = events[-1]["seq"]
    assert [e["seq"] for e in events] == list(range(1, s["last_seq"] + 1))
    assert [e["type"] for e in events] == s["event_types"]
    r = d.request("GET", f"/v1/sessions/{s['id']}/broker/calls")
    assert r.status == 200, r
    assert [{k: c[k] for k in ("seq", "tool", "status", "decision")} for c in r.json()["calls"]] == s["broker_calls"]
    # The round, its candidate session, Runs and graded submission.
    rd = fx["round"]
    r = d.request("GET", f"/v1/rounds/{rd['id']}")
    assert r.status == 200, r
    base = f"/v1/rounds/{rd['id']}/sessions/{rd['session']}"
    r = d.request("GET", base)
    assert r.status == 200 and r.json()["state"] == rd["session_state"], r
    assert {k: r.json()["result"][k] for k in ("passed", "total")} == rd["result"]
    r = d.request("GET", f"{base}/runs")
    assert r.status == 200 and [x["verdict"] for x in r.json()["runs"]] == rd["runs"], r
    rep = d.request("GET", f"{base}/report").json()
    assert [x["submission_id"] for x in rep["submissions"]] == [rd["submission"]], rep
    assert [(g["passed"], g["total"]) for g in rep["submissions"][0]["gradings"]] == \
        [(rd["result"]["passed"], rd["result"]["total"])], rep


def check_db(d, fx):
    """Every row of every old table is in its new table (whole, where the
    daemon does not change it); returns the new tables' counts."""
    db = os.path.join(d.data_dir, "hatchery.db")
    assert fx["tables"] == {n: {t: count(os.path.join(FIXTURE, n), t) for t in fx["tables"][n]} for n in FILES}
    for file, old, new, key, cols, *where in TABLES:
        old_path = os.path.join(FIXTURE, file)
        want = rows(old_path, old, cols or key, *where)
        # What the fixture's daemon left empty (it is still copied).
        assert want or old in ("blobs", "keys", "sandbox_bindings"), f"the fixture's {file} {old} is empty"
        have = set(rows(db, new, cols or key))
        missing = [w for w in want if w not in have]
        assert not missing, f"{file} {old} -> {new}: {len(missing)} of {len(want)} rows missing: {missing[:3]}"
    # The sandbox records: the old states, but `kept` (running then) now
    # stopped by the reconcile, with its event after the old ones: `lost`,
    # or `ttl` once its expiry has passed (the fixture ages; the rule is
    # hatchery-core's reconcile.rs, applied at this start).
    c = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    got = dict((r[0], r[1:]) for r in c.execute("SELECT id, state, end_reason, metadata FROM core_sandboxes"))
    prev = sqlite3.connect(f"file:{os.path.join(FIXTURE, 'state.db')}?mode=ro", uri=True)
    started_ms = d.started_ms
    for sid, state, end_reason, metadata, expires in prev.execute(
            "SELECT id, state, end_reason, metadata, expires_at_ms FROM sandboxes"):
        if state in ("running", "pooled"):
            why = "ttl" if expires <= started_ms else "lost"
            assert got[sid] == ("stopped", why, metadata), (sid, got[sid])
        else:
            assert got[sid] == (state, end_reason, metadata), (sid, got[sid])
    kept = fx["sandboxes"]["kept"]
    assert json.loads(got[kept][2]) == {"fixture": "kept"}
    assert got[fx["sandboxes"]["deleted"]][:2] == ("stopped", "deleted")
    # The host's lease: the import keeps the higher epoch, and this start
    # took a newer one than the old daemon's (its writes are fenced out).
    new_epochs = dict(c.execute("SELECT resource, epoch FROM core_leases"))
    for resource, epoch in prev.execute("SELECT resource, epoch FROM leases"):
        assert new_epochs[resource] > epoch, (resource, new_epochs, epoch)
    last_old = prev.execute("SELECT max(seq) FROM events").fetchone()[0]
    lost = c.execute("SELECT seq FROM core_events WHERE sandbox_id = ? AND kind = 'stopped'", (kept,)).fetchall()
    assert len(lost) == 1 and lost[0][0] > last_old, (lost, last_old)
    prev.close()
    imports = dict(c.execute("SELECT file, imported_at_ms FROM hatchery_imports").fetchall())
    c.close()
    assert sorted(imports) == sorted(FILES), imports
    # The chains verify, with the heads the old release had.
    chains = audit_verify(db)
    for chain, want in fx["chains"].items():
        assert chain in chains, (chain, sorted(chains))
        assert (chains[chain]["verified"], chains[chain]["head"]) == (want["verified"], want["head"]), chains[chain]
        assert chains[chain]["first_bad"] is None
    return imports, {t[2]: count(db, t[2]) for t in TABLES}


@pytest.mark.timeout(120)
def test_upgrade_in_place_from_e1cedfa(upgraded):
    d, fx = upgraded
    check_api(d, fx)
    d.stop()
    imports, counts = check_db(d, fx)
    # A second start imports nothing again: the same rows, the same record.
    d.start()
    check_api(d, fx)
    d.stop()
    imports2, counts2 = check_db(d, fx)
    assert imports2 == imports
    assert counts2 == counts
    d.start()  # cleanup() deletes what is left through the API
