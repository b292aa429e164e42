//! Numbered schema migrations, applied in order inside one transaction
//! each; `PRAGMA user_version` records the last one applied.

pub const MIGRATIONS: &[(u32, &str)] = &[
    (
        1,
        "CREATE TABLE sessions (
        id TEXT PRIMARY KEY,
        spec TEXT NOT NULL,
        state TEXT NOT NULL,
        repo TEXT NOT NULL,
        idempotency_key TEXT UNIQUE,
        request_hash TEXT NOT NULL,
        created_at TEXT NOT NULL,
        started_at TEXT,
        ended_at TEXT,
        reason TEXT,
        spend_tokens INTEGER NOT NULL DEFAULT 0,
        spend_usd_cents INTEGER NOT NULL DEFAULT 0,
        spend_wall_s INTEGER NOT NULL DEFAULT 0,
        sandbox_id TEXT,
        process_id TEXT,
        snapshot_id TEXT,
        review_snapshot_id TEXT,
        waiting TEXT,
        output_offset INTEGER NOT NULL DEFAULT 0,
        agent_seq INTEGER NOT NULL DEFAULT 0,
        delivered_seq INTEGER NOT NULL DEFAULT 0,
        cancel_requested INTEGER NOT NULL DEFAULT 0,
        last_seq INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX sessions_state ON sessions(state);
    CREATE TABLE events (
        session_id TEXT NOT NULL REFERENCES sessions(id),
        seq INTEGER NOT NULL,
        at TEXT NOT NULL,
        actor TEXT NOT NULL,
        type TEXT NOT NULL,
        data TEXT NOT NULL,
        PRIMARY KEY (session_id, seq)
    ) WITHOUT ROWID;
    CREATE TABLE blobs (
        session_id TEXT NOT NULL REFERENCES sessions(id),
        ref TEXT NOT NULL,
        data BLOB NOT NULL,
        PRIMARY KEY (session_id, ref)
    ) WITHOUT ROWID;
    CREATE TABLE approvals (
        id TEXT PRIMARY KEY,
        session_id TEXT NOT NULL REFERENCES sessions(id),
        action TEXT NOT NULL,
        details TEXT NOT NULL,
        state TEXT NOT NULL,
        decision TEXT,
        note TEXT,
        created_at TEXT NOT NULL,
        decided_at TEXT
    );
    CREATE INDEX approvals_session ON approvals(session_id, state);",
    ),
    (
        2,
        // The hash chain over each session's events (store/chain.rs); the
        // view is the audit crate's table layout, for `hatchery audit verify`.
        "ALTER TABLE events ADD COLUMN prev_hash TEXT;
    ALTER TABLE events ADD COLUMN hash TEXT;
    CREATE VIEW audit_events AS
        SELECT session_id AS chain, seq, at AS ts, type AS kind,
               json_set(data, '$.actor', actor) AS data, prev_hash, hash
        FROM events;",
    ),
    (
        3,
        // Ownership and fencing: the host that may write a session, its
        // epoch, and the epoch each event was written under. Rows from
        // before belong to the single-host default at epoch 1.
        "ALTER TABLE sessions ADD COLUMN host_id TEXT NOT NULL DEFAULT 'local';
    ALTER TABLE sessions ADD COLUMN epoch INTEGER NOT NULL DEFAULT 1;
    ALTER TABLE events ADD COLUMN epoch INTEGER NOT NULL DEFAULT 1;
    CREATE INDEX sessions_host_state ON sessions(host_id, state);",
    ),
    (
        4,
        // Rewinds to a checkpoint (runner.rs, resume_from_checkpoint).
        "ALTER TABLE sessions ADD COLUMN replay_through INTEGER NOT NULL DEFAULT 0;",
    ),
    (
        5,
        // Delivery ids of writes sent from another process (append_once).
        "CREATE TABLE session_deliveries (
       session_id TEXT NOT NULL,
       key TEXT NOT NULL,
       PRIMARY KEY (session_id, key)
     );",
    ),
    (
        6,
        // The broker finds a call's session by its sandbox (with_sandbox);
        // only unfinished sessions are asked for, so only they are indexed.
        "CREATE INDEX sessions_live_sandbox ON sessions(sandbox_id)
       WHERE state NOT IN ('completed','failed','cancelled');",
    ),
];

pub fn apply(conn: &mut rusqlite::Connection) -> rusqlite::Result<()> {
    let current: u32 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    for (n, sql) in MIGRATIONS {
        if *n <= current {
            continue;
        }
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", n)?;
        tx.commit()?;
    }
    Ok(())
}
