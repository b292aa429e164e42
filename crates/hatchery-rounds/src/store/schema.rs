//! The rounds tables, the same names and text on both databases, as one
//! numbered migration set (append only: a released step is never edited).
//!
//! Step 1 is `IF NOT EXISTS` throughout because a PostgreSQL database
//! made by the previous release already has these tables, under these
//! names (its own runner recorded them in `rounds_schema`, left in place):
//! there step 1 adopts them with their rows. On SQLite the previous
//! release kept rounds in a file of their own, `DATA_DIR/rounds.db`, with
//! unprefixed names (`sessions`, `tokens`, ...); [`IMPORT`] copies it in.

use hatchery_db::{copy_table, Import, Migrations, Step};

pub static MIGRATIONS: Migrations = Migrations {
    product: "rounds",
    steps: &[
        Step::Both(
            "CREATE TABLE IF NOT EXISTS rounds (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            state TEXT NOT NULL,
            template TEXT NOT NULL,
            template_version TEXT NOT NULL,
            spec TEXT NOT NULL,
            tests TEXT NOT NULL,
            prepared_snapshot TEXT,
            error TEXT,
            created_at_ms BIGINT NOT NULL
         );
         CREATE TABLE IF NOT EXISTS round_sessions (
            id TEXT PRIMARY KEY,
            round_id TEXT NOT NULL REFERENCES rounds(id),
            candidate TEXT NOT NULL,
            state TEXT NOT NULL,
            sandbox_id TEXT,
            created_at_ms BIGINT NOT NULL,
            expires_at_ms BIGINT NOT NULL,
            error TEXT
         );
         CREATE INDEX IF NOT EXISTS round_sessions_round ON round_sessions(round_id, created_at_ms);
         CREATE INDEX IF NOT EXISTS round_sessions_expiry ON round_sessions(state, expires_at_ms);
         CREATE TABLE IF NOT EXISTS round_tokens (
            hash TEXT PRIMARY KEY,
            scope TEXT NOT NULL,
            round_id TEXT NOT NULL,
            session_id TEXT,
            created_at_ms BIGINT NOT NULL,
            expires_at_ms BIGINT NOT NULL
         );
         CREATE TABLE IF NOT EXISTS round_runs (
            seq BIGSERIAL PRIMARY KEY,
            id TEXT NOT NULL UNIQUE,
            session_id TEXT NOT NULL,
            created_at_ms BIGINT NOT NULL,
            result TEXT NOT NULL
         );
         CREATE INDEX IF NOT EXISTS round_runs_session ON round_runs(session_id, seq);
         CREATE TABLE IF NOT EXISTS round_submissions (
            seq BIGSERIAL PRIMARY KEY,
            id TEXT NOT NULL UNIQUE,
            session_id TEXT NOT NULL,
            round_id TEXT NOT NULL,
            files TEXT NOT NULL,
            sha256 TEXT NOT NULL,
            created_at_ms BIGINT NOT NULL
         );
         CREATE INDEX IF NOT EXISTS round_submissions_session ON round_submissions(session_id, seq);
         CREATE TABLE IF NOT EXISTS round_gradings (
            seq BIGSERIAL PRIMARY KEY,
            id TEXT NOT NULL UNIQUE,
            submission_id TEXT NOT NULL,
            created_at_ms BIGINT NOT NULL,
            status TEXT NOT NULL,
            passed BIGINT NOT NULL,
            total BIGINT NOT NULL,
            report TEXT NOT NULL
         );
         CREATE INDEX IF NOT EXISTS round_gradings_submission ON round_gradings(submission_id, seq);
         CREATE TABLE IF NOT EXISTS round_replays (
            id TEXT PRIMARY KEY,
            session_id TEXT NOT NULL,
            round_id TEXT NOT NULL,
            snapshot_id TEXT NOT NULL,
            reason TEXT NOT NULL,
            created_at_ms BIGINT NOT NULL,
            expires_at_ms BIGINT NOT NULL,
            state TEXT NOT NULL
         );
         CREATE INDEX IF NOT EXISTS round_replays_session ON round_replays(session_id, created_at_ms);
         CREATE INDEX IF NOT EXISTS round_replays_due ON round_replays(state, expires_at_ms);
         CREATE TABLE IF NOT EXISTS round_forks (
            id TEXT PRIMARY KEY,
            replay_id TEXT NOT NULL,
            round_id TEXT NOT NULL,
            sandbox_id TEXT NOT NULL,
            owner TEXT NOT NULL,
            created_at_ms BIGINT NOT NULL,
            expires_at_ms BIGINT NOT NULL
         );",
        ),
        // The live room's log (src/room/) and the interviewers' notes: every accepted update of a
        // session's shared document, and a marker where each Run and
        // Submit captured it. `idx` numbers a session's entries from 0
        // (the server's seed); unique, so two processes cannot both
        // append entry n.
        Step::Both(
            "CREATE TABLE round_doc_log (
            seq BIGSERIAL PRIMARY KEY,
            session_id TEXT NOT NULL,
            idx BIGINT NOT NULL,
            kind TEXT NOT NULL,
            author TEXT NOT NULL,
            ref_id TEXT,
            body BYTEA NOT NULL,
            created_at_ms BIGINT NOT NULL,
            UNIQUE (session_id, idx)
         );
         CREATE TABLE round_notes (
            session_id TEXT PRIMARY KEY,
            text TEXT NOT NULL,
            author TEXT NOT NULL,
            updated_at_ms BIGINT NOT NULL
         );",
        ),
        // 3 (issue 36): the tenant whose key made the round (NULL: the
        // operator's).
        Step::Both("ALTER TABLE rounds ADD COLUMN tenant TEXT;"),
        // 4 (issue 41): playback checkpoints, the document's whole state
        // (a Yjs update) right after log entry `idx`, so `document?at=`
        // replays only the entries past the nearest one. `log_bytes`: the
        // log's update bytes up to `idx`. Keyed to their log entry and
        // deleted with it (retention deletes the log).
        Step::Both(
            "CREATE TABLE round_doc_checkpoints (
            session_id TEXT NOT NULL,
            idx BIGINT NOT NULL,
            state BYTEA NOT NULL,
            log_bytes BIGINT NOT NULL,
            created_at_ms BIGINT NOT NULL,
            PRIMARY KEY (session_id, idx),
            FOREIGN KEY (session_id, idx) REFERENCES round_doc_log (session_id, idx)
                ON DELETE CASCADE
         );",
        ),
    ],
};

/// A single-host data dir of the previous release: `rounds.db` at its
/// last schema (`PRAGMA user_version` 1), copied once into the one
/// database. `seq` is copied as it was, so runs, submissions and gradings
/// keep their order and new rows number after them.
pub static IMPORT: Import = Import {
    file: "rounds.db",
    copy: &[
        copy_table!("rounds", "rounds", "id, name, state, template, template_version, spec, tests, prepared_snapshot, error, created_at_ms"),
        copy_table!("round_sessions", "sessions", "id, round_id, candidate, state, sandbox_id, created_at_ms, expires_at_ms, error"),
        copy_table!("round_tokens", "tokens", "hash, scope, round_id, session_id, created_at_ms, expires_at_ms"),
        copy_table!("round_runs", "runs", "seq, id, session_id, created_at_ms, result"),
        copy_table!("round_submissions", "submissions", "seq, id, session_id, round_id, files, sha256, created_at_ms"),
        copy_table!("round_gradings", "gradings", "seq, id, submission_id, created_at_ms, status, passed, total, report"),
        copy_table!("round_replays", "replays", "id, session_id, round_id, snapshot_id, reason, created_at_ms, expires_at_ms, state"),
        copy_table!("round_forks", "forks", "id, replay_id, round_id, sandbox_id, owner, created_at_ms, expires_at_ms"),
    ],
};
