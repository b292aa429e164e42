//! The sessions' PostgreSQL schema (hatchery-sessions' store/pg.rs runs
//! it; `hatchery audit verify` checks a database against it).

/// Numbered migrations; `hatchery_sessions_schema` holds one row per
/// migration run. Each runs in the transaction that records it, under an
/// advisory lock, so two daemons starting at once end up with one schema
/// and a second run is a no-op.
pub const MIGRATIONS: &[&str] = &[
    "CREATE TABLE sessions (
       ord BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
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
       spend_tokens BIGINT NOT NULL DEFAULT 0,
       spend_usd_cents BIGINT NOT NULL DEFAULT 0,
       spend_wall_s BIGINT NOT NULL DEFAULT 0,
       sandbox_id TEXT,
       process_id TEXT,
       snapshot_id TEXT,
       review_snapshot_id TEXT,
       waiting TEXT,
       output_offset BIGINT NOT NULL DEFAULT 0,
       agent_seq BIGINT NOT NULL DEFAULT 0,
       delivered_seq BIGINT NOT NULL DEFAULT 0,
       cancel_requested BOOLEAN NOT NULL DEFAULT false,
       last_seq BIGINT NOT NULL DEFAULT 0,
       host_id TEXT NOT NULL,
       epoch BIGINT NOT NULL
     );
     CREATE INDEX sessions_state ON sessions(state, ord);
     CREATE INDEX sessions_host_state ON sessions(host_id, state);
     CREATE TABLE session_events (
       session_id TEXT NOT NULL REFERENCES sessions(id),
       seq BIGINT NOT NULL,
       at TEXT NOT NULL,
       actor TEXT NOT NULL,
       type TEXT NOT NULL,
       data TEXT NOT NULL,
       prev_hash TEXT NOT NULL,
       hash TEXT NOT NULL,
       epoch BIGINT NOT NULL,
       PRIMARY KEY (session_id, seq)
     );
     CREATE TABLE session_blobs (
       session_id TEXT NOT NULL REFERENCES sessions(id),
       ref TEXT NOT NULL,
       data BYTEA NOT NULL,
       PRIMARY KEY (session_id, ref)
     );
     CREATE TABLE session_approvals (
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
     CREATE INDEX session_approvals_session ON session_approvals(session_id, state);",
    // Rewinds to a checkpoint (runner.rs, resume_from_checkpoint).
    "ALTER TABLE sessions ADD COLUMN replay_through BIGINT NOT NULL DEFAULT 0;",
    // Delivery ids of writes sent from another process (append_once).
    "CREATE TABLE session_deliveries (
       session_id TEXT NOT NULL,
       key TEXT NOT NULL,
       PRIMARY KEY (session_id, key)
     );",
    // The broker finds a call's session by its sandbox on every call
    // (with_sandbox), from any host; only unfinished sessions are asked
    // for, so only they are indexed.
    "CREATE INDEX sessions_live_sandbox ON sessions(sandbox_id)
       WHERE state NOT IN ('completed','failed','cancelled');",
];

pub const SCHEMA: hatchery_store::PgMigrations = hatchery_store::PgMigrations {
    name: "Hatchery sessions",
    table: "hatchery_sessions_schema",
    lock: MIGRATION_LOCK,
    steps: MIGRATIONS,
};

/// Any fixed number (not hatchery-store's): serializes these migrations.
pub const MIGRATION_LOCK: i64 = 0x6873_6573_7369_6f6e;
