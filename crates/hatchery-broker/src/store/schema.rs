//! The broker's tables, one numbered migration set on both databases, and
//! the copy of a single-host data dir's old DATA_DIR/broker.db into the
//! one database.

use hatchery_db::{Import, Migrations, Step};

/// Append only. Every statement says IF NOT EXISTS because a PostgreSQL
/// database of the previous release already has these tables, under these
/// names and in this shape (made by the broker's own runner, recorded in
/// `broker_schema`): they are kept as they are, with their rows.
pub const MIGRATIONS: Migrations = Migrations {
    product: "broker",
    steps: &[Step::Both(
        "CREATE TABLE IF NOT EXISTS broker_calls (
            session_id TEXT NOT NULL,
            seq BIGINT NOT NULL,
            epoch BIGINT NOT NULL,
            tool TEXT NOT NULL,
            args_sha256 TEXT NOT NULL,
            args TEXT NOT NULL,
            state TEXT NOT NULL,
            decision TEXT NOT NULL,
            rule_id TEXT,
            approval_id TEXT,
            event_seq BIGINT,
            result_event_seq BIGINT,
            effect TEXT,
            output TEXT,
            review_event_seq BIGINT,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            runner TEXT,
            PRIMARY KEY (session_id, seq)
        );
        CREATE INDEX IF NOT EXISTS broker_calls_state ON broker_calls(state);
        CREATE TABLE IF NOT EXISTS broker_epochs (
            sandbox_id TEXT PRIMARY KEY,
            session_id TEXT NOT NULL,
            epoch BIGINT NOT NULL,
            UNIQUE (session_id, epoch)
        );
        -- Which broker processes are alive, by the database's clock
        -- (PostgreSQL only: on SQLite one process uses the file).
        CREATE TABLE IF NOT EXISTS broker_runners (
            runner TEXT PRIMARY KEY,
            expires_at TIMESTAMPTZ NOT NULL
        );",
    )],
};

/// The previous release's DATA_DIR/broker.db (its tables `calls` and
/// `epochs`, at its last migration, 3).
pub const IMPORT: Import = Import {
    file: "broker.db",
    copy: &[
        "INSERT INTO broker_calls (session_id, seq, epoch, tool, args_sha256, args, state,
            decision, rule_id, approval_id, event_seq, result_event_seq, effect, output,
            review_event_seq, created_at, updated_at, runner)
         SELECT session_id, seq, epoch, tool, args_sha256, args, state,
            decision, rule_id, approval_id, event_seq, result_event_seq, effect, output,
            review_event_seq, created_at, updated_at, runner
         FROM old.calls",
        "INSERT INTO broker_epochs (sandbox_id, session_id, epoch)
         SELECT sandbox_id, session_id, epoch FROM old.epochs",
    ],
};
