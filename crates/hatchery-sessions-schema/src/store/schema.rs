//! The sessions' tables, in the deployment's one database (SQLite file or
//! PostgreSQL): `sessions`, `session_events` (the hash-chained log),
//! `session_blobs`, `session_approvals` and `session_deliveries`. One
//! numbered migration set for both databases (hatchery-db's runner,
//! product `session`); hatchery-sessions' store runs it, `hatchery audit
//! verify` only checks it.

use hatchery_db::{Migrations, Step};

/// The tables as of the one database. `IF NOT EXISTS` throughout: on
/// PostgreSQL a database made by the previous release already has these
/// tables under these names (its own runner recorded them in
/// `hatchery_sessions_schema`), and they upgrade in place, rows kept; no
/// rename is needed because the PostgreSQL names were already prefixed.
/// On SQLite the tables are new in `hatchery.db`; the old
/// `DATA_DIR/sessions.db` is copied in once (hatchery-sessions'
/// `store::IMPORT`).
///
/// `ord` is the creation order (`list` pages by it): a fresh database
/// gets it as the key; an upgraded PostgreSQL one keeps its identity
/// column `ord` (UNIQUE) beside the `id` key, which the same queries use.
macro_rules! tables {
    () => {
        "CREATE TABLE IF NOT EXISTS sessions (
           ord BIGSERIAL PRIMARY KEY,
           id TEXT NOT NULL UNIQUE,
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
           epoch BIGINT NOT NULL,
           replay_through BIGINT NOT NULL DEFAULT 0
         );
         CREATE INDEX IF NOT EXISTS sessions_state ON sessions(state, ord);
         CREATE INDEX IF NOT EXISTS sessions_host_state ON sessions(host_id, state);
         -- The broker finds a call's session by its sandbox on every call
         -- (with_sandbox), from any host; only unfinished sessions are
         -- asked for, so only they are indexed.
         CREATE INDEX IF NOT EXISTS sessions_live_sandbox ON sessions(sandbox_id)
           WHERE state NOT IN ('completed','failed','cancelled');
         -- Each row is sealed onto its session's hash chain when written
         -- (hash = SHA-256(prev_hash || canonical event)); an edited,
         -- removed or swapped row is named by `hatchery audit verify`.
         CREATE TABLE IF NOT EXISTS session_events (
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
         CREATE TABLE IF NOT EXISTS session_blobs (
           session_id TEXT NOT NULL REFERENCES sessions(id),
           ref TEXT NOT NULL,
           data BYTEA NOT NULL,
           PRIMARY KEY (session_id, ref)
         );
         CREATE TABLE IF NOT EXISTS session_approvals (
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
         CREATE INDEX IF NOT EXISTS session_approvals_session
           ON session_approvals(session_id, state);
         -- Delivery ids of writes sent from another process (append_once).
         CREATE TABLE IF NOT EXISTS session_deliveries (
           session_id TEXT NOT NULL,
           key TEXT NOT NULL,
           PRIMARY KEY (session_id, key)
         );"
    };
}

/// Append only: a released step is never edited.
pub const SCHEMA: Migrations = Migrations {
    product: "session",
    steps: &[Step::Each {
        sqlite: tables!(),
        // A previous release's PostgreSQL database is at its last
        // migration (replay_through included); the column is added here
        // too should one have stopped short of it.
        postgres: concat!(
            tables!(),
            "\nALTER TABLE sessions ADD COLUMN IF NOT EXISTS replay_through BIGINT NOT NULL DEFAULT 0;"
        ),
    },
    // Issue 36: the tenant whose key made the session (NULL: the
    // operator's); a tenant's list is filtered on it. The budget in
    // columns too: a create sums the tenant's reserved budgets in SQL.
    Step::Each {
        sqlite: "ALTER TABLE sessions ADD COLUMN tenant TEXT;
                 ALTER TABLE sessions ADD COLUMN budget_tokens BIGINT NOT NULL DEFAULT 0;
                 ALTER TABLE sessions ADD COLUMN budget_usd_cents BIGINT NOT NULL DEFAULT 0;
                 ALTER TABLE sessions ADD COLUMN budget_wall_s BIGINT NOT NULL DEFAULT 0;
                 CREATE INDEX IF NOT EXISTS sessions_tenant ON sessions (tenant, ord);",
        postgres: "ALTER TABLE sessions ADD COLUMN IF NOT EXISTS tenant TEXT;
                   ALTER TABLE sessions ADD COLUMN IF NOT EXISTS budget_tokens BIGINT NOT NULL DEFAULT 0;
                   ALTER TABLE sessions ADD COLUMN IF NOT EXISTS budget_usd_cents BIGINT NOT NULL DEFAULT 0;
                   ALTER TABLE sessions ADD COLUMN IF NOT EXISTS budget_wall_s BIGINT NOT NULL DEFAULT 0;
                   CREATE INDEX IF NOT EXISTS sessions_tenant ON sessions (tenant, ord);",
    },
    // Issue 37: what each numbered agent message asked (its kind and the
    // part that decides its effect: a tool call's tool and arguments, a
    // command), so that its re-run after a resume from a checkpoint is
    // compared with it.
    Step::Both(
        "CREATE TABLE IF NOT EXISTS session_agent_lines (
           session_id TEXT NOT NULL,
           n BIGINT NOT NULL,
           kind TEXT NOT NULL,
           asked TEXT NOT NULL,
           PRIMARY KEY (session_id, n)
         );",
    )],
};
