//! Where rounds keep their state, behind a small async trait
//! ([`RoundStore`]): [`DbStore`], the deployment's one database
//! (`hatchery-db`: `DATA_DIR/hatchery.db` on a single host, the
//! `--db postgres://` database on many), the same tables on both:
//! `rounds`, `round_sessions`, `round_tokens`, `round_runs`,
//! `round_submissions`, `round_gradings`, `round_replays`, `round_forks`,
//! `round_doc_log`, `round_doc_checkpoints`, `round_notes` (`schema.rs`;
//! migrations recorded as product `rounds` in `hatchery_migrations`). The
//! queries are written once (`db.rs`); the one PostgreSQL-only piece is
//! the session hold (`pg_lock.rs`). One
//! contract, checked by one suite on both databases (`conformance.rs`).
//! Every state change names the states it may move from.

mod appender;
mod db;
mod pg_lock;
mod schema;

#[cfg(test)]
mod conformance;

pub use db::DbStore;
pub use schema::{IMPORT, MIGRATIONS};

use crate::state::{RoundState, SessionState};
use async_trait::async_trait;
use hatchery_db::{DbError, MigrateError};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database failed or refused a statement. [`StoreError::unavailable`]
    /// says whether to retry (503), [`StoreError::conflict`] whether a
    /// unique key refused it (409); anything else is for logs (500).
    #[error("database: {0}")]
    Db(DbError),
    /// The rounds schema could not be brought up to date at open.
    #[error("{0}")]
    Schema(#[from] MigrateError),
    /// A guard of ours refused the write (the text says which).
    #[error("conflict: {0}")]
    Conflict(String),
    /// A stored value is none of ours (an unknown state or scope).
    #[error("corrupt record: {0}")]
    Corrupt(String),
    /// The task that writes the rooms' updates (`appender.rs`) is gone:
    /// the runtime is shutting down.
    #[error("the document log's writer has stopped")]
    WriterGone,
    /// A number too large for the database's signed 64-bit integer.
    #[error("{what} {value} is out of range")]
    OutOfRange { what: &'static str, value: u64 },
}

impl StoreError {
    /// The database is not reachable now (retryable): answered 503, never
    /// 500.
    pub fn unavailable(&self) -> bool {
        match self {
            StoreError::Db(e) => e.unavailable(),
            StoreError::Schema(e) => e.unavailable(),
            _ => false,
        }
    }

    /// A uniqueness, a constraint or a guard refused the write: 409.
    pub fn conflict(&self) -> bool {
        match self {
            StoreError::Db(e) => e.unique_violation() || e.refused_by_schema(),
            StoreError::Conflict(_) => true,
            _ => false,
        }
    }
}

impl From<DbError> for StoreError {
    /// A stored name that is none of ours reads as `Corrupt`, never as
    /// some default state or scope; a number past the database's integer
    /// is refused, never wrapped.
    fn from(e: DbError) -> Self {
        match e {
            DbError::Type { .. } => StoreError::Corrupt(e.to_string()),
            DbError::OutOfRange { column, value } => StoreError::OutOfRange {
                what: column,
                value,
            },
            e => StoreError::Db(e),
        }
    }
}

pub type StoreResult<T> = Result<T, StoreError>;

/// A session held by this process across every process on the store
/// ([`RoundStore::lock_session`]); dropping it releases the session.
pub struct SessionHold {
    _held: Box<dyn Send + Sync>,
}

impl SessionHold {
    pub(crate) fn new(held: impl Send + Sync + 'static) -> SessionHold {
        SessionHold {
            _held: Box::new(held),
        }
    }
}

hatchery_db::record! {
    #[derive(Debug, Clone, PartialEq)]
    pub struct RoundRecord in "rounds" {
        pub id: String,
        pub name: String,
        pub state: RoundState,
        pub template: String,
        pub template_version: String,
        /// The round's public definition (`RoundSpec`, JSON).
        pub spec: String,
        /// The hidden suite (`TestSuite`, JSON). Only the grader reads it.
        pub tests: String,
        pub prepared_snapshot: Option<String>,
        pub error: Option<String>,
        pub created_at_ms: u64,
        /// The tenant whose key made the round (issue 36); `None`: the
        /// operator's.
        pub tenant: Option<String>,
    }
}

hatchery_db::record! {
    #[derive(Debug, Clone, PartialEq)]
    pub struct SessionRecord in "round_sessions" {
        pub id: String,
        pub round_id: String,
        pub candidate: String,
        pub state: SessionState,
        pub sandbox_id: Option<String>,
        pub created_at_ms: u64,
        pub expires_at_ms: u64,
        pub error: Option<String>,
    }
}

hatchery_db::named!(RoundState, as_str, parse);
hatchery_db::named!(SessionState, as_str, parse);

hatchery_db::names! {
    /// An unknown stored scope reads as a corrupt row, never as some scope
    /// (it must not grant a reviewer's).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Scope {
        Candidate = "candidate",
        Reviewer = "reviewer",
        /// One round's live rooms (src/room/): watch, pair when allowed,
        /// keep notes. Not a reviewer: no reports, no hidden tests.
        Interviewer = "interviewer",
    }
}

hatchery_db::record! {
    #[derive(Debug, Clone, PartialEq)]
    pub struct TokenRecord in "round_tokens" {
        /// SHA-256 of the token, hex. The token itself is never stored.
        pub hash: String,
        pub scope: Scope,
        pub round_id: String,
        pub session_id: Option<String>,
        pub created_at_ms: u64,
        pub expires_at_ms: u64,
    }
}

hatchery_db::record! {
    #[derive(Debug, Clone, PartialEq)]
    pub struct RunRecord in "round_runs" {
        pub id: String,
        pub session_id: String,
        pub created_at_ms: u64,
        /// The `RunResult` JSON the candidate got.
        pub result: String,
    }
}

hatchery_db::record! {
    #[derive(Debug, Clone, PartialEq)]
    pub struct SubmissionRecord in "round_submissions" {
        pub id: String,
        pub session_id: String,
        pub round_id: String,
        /// `{path: text}` JSON as captured.
        pub files: String,
        pub sha256: String,
        pub created_at_ms: u64,
    }
}

hatchery_db::record! {
    #[derive(Debug, Clone, PartialEq)]
    pub struct GradingRecord in "round_gradings" {
        pub id: String,
        pub submission_id: String,
        pub created_at_ms: u64,
        /// `graded` or `error`.
        pub status: String,
        pub passed: u32,
        pub total: u32,
        /// The full report (`GradingReport` JSON): reviewer only.
        pub report: String,
    }
}

hatchery_db::record! {
    #[derive(Debug, Clone, PartialEq)]
    pub struct ReplayRecord in "round_replays" {
        pub id: String,
        pub session_id: String,
        pub round_id: String,
        pub snapshot_id: String,
        /// `end` or `on_demand`.
        pub reason: String,
        pub created_at_ms: u64,
        pub expires_at_ms: u64,
        /// `active` or `expired`.
        pub state: String,
    }
}

hatchery_db::record! {
    #[derive(Debug, Clone, PartialEq)]
    pub struct ForkRecord in "round_forks" {
        pub id: String,
        pub replay_id: String,
        pub round_id: String,
        pub sandbox_id: String,
        /// Who made it (a token hash, or `api_key`): only they may use it.
        pub owner: String,
        pub created_at_ms: u64,
        pub expires_at_ms: u64,
    }
}

hatchery_db::record! {
    #[derive(Debug, Clone, PartialEq)]
    pub struct DocLogRecord in "round_doc_log" {
        pub session_id: String,
        /// The entry's place in the session's log, from 0 (the seed).
        pub idx: u64,
        /// `seed`, `update`, `run` or `submit`.
        pub kind: String,
        /// Who: `server`, `candidate`, `interviewer:<id>`.
        pub author: String,
        /// The Run's or the submission's id, for a marker.
        pub ref_id: Option<String>,
        /// The Yjs update (v1 encoding); empty for a marker.
        pub body: Vec<u8>,
        pub created_at_ms: u64,
    }
}

hatchery_db::record! {
    /// The document's whole state right after log entry `idx`
    /// (`room/checkpoint.rs`): playback starts here instead of at entry 0.
    #[derive(Debug, Clone, PartialEq)]
    pub struct DocCheckpointRecord in "round_doc_checkpoints" {
        pub session_id: String,
        pub idx: u64,
        /// The document as one Yjs update (v1), pending structs included.
        pub state: Vec<u8>,
        /// The log's update bytes up to and with `idx`.
        pub log_bytes: u64,
        pub created_at_ms: u64,
    }
}

hatchery_db::record! {
    #[derive(Debug, Clone, PartialEq)]
    pub struct NotesRecord in "round_notes" {
        pub session_id: String,
        pub text: String,
        /// Who wrote the last version (`interviewer:<id>`, `api_key`).
        pub author: String,
        pub updated_at_ms: u64,
    }
}

#[async_trait]
pub trait RoundStore: Send + Sync + 'static {
    async fn insert_round(&self, r: &RoundRecord) -> StoreResult<()>;
    async fn get_round(&self, id: &str) -> StoreResult<Option<RoundRecord>>;
    async fn list_rounds(&self) -> StoreResult<Vec<RoundRecord>>;
    /// Moves the round to `to` if it is in one of `from`; `false` if not.
    async fn set_round_state(
        &self,
        id: &str,
        from: &[RoundState],
        to: RoundState,
        prepared_snapshot: Option<&str>,
        error: Option<&str>,
    ) -> StoreResult<bool>;

    /// The session and its candidate token, in one transaction.
    async fn insert_session(&self, s: &SessionRecord, token: &TokenRecord) -> StoreResult<()>;
    async fn get_session(&self, id: &str) -> StoreResult<Option<SessionRecord>>;
    async fn list_sessions(&self, round_id: &str) -> StoreResult<Vec<SessionRecord>>;
    /// Sessions in `state` (a restarted daemon resumes `submitted` ones).
    async fn sessions_in_state(&self, state: SessionState) -> StoreResult<Vec<SessionRecord>>;
    /// Sessions not ended whose expiry has passed.
    async fn expired_sessions(&self, now_ms: u64) -> StoreResult<Vec<SessionRecord>>;
    async fn set_session_state(
        &self,
        id: &str,
        from: &[SessionState],
        to: SessionState,
        sandbox_id: Option<&str>,
        error: Option<&str>,
    ) -> StoreResult<bool>;

    async fn insert_token(&self, t: &TokenRecord) -> StoreResult<()>;
    async fn get_token(&self, hash: &str) -> StoreResult<Option<TokenRecord>>;

    /// Records a run, keeping the newest `keep` of the session.
    async fn insert_run(&self, r: &RunRecord, keep: usize) -> StoreResult<()>;
    async fn list_runs(&self, session_id: &str) -> StoreResult<Vec<RunRecord>>;

    /// Moves the session to `submitted` (from one of `from`) and records
    /// the submission, in one transaction; `false` (nothing written) if
    /// the session was not in one of `from`.
    async fn begin_submission(
        &self,
        sub: &SubmissionRecord,
        from: &[SessionState],
    ) -> StoreResult<bool>;
    /// The first grading of a submission: records it and moves the session
    /// from `submitted` to `graded`, in one transaction, only if the
    /// submission has no grading yet; `false` (nothing written) if it has
    /// one (two processes graded it: a restarted daemon resumed a grading
    /// another one was still running). Racing calls are serialized on the
    /// submission, so exactly one of them writes. A submission that is not
    /// stored is a `Conflict`.
    async fn finish_grading(&self, g: &GradingRecord, session_id: &str) -> StoreResult<bool>;
    /// A regrade: only the grading row (unguarded: regrades add rows).
    async fn insert_grading(&self, g: &GradingRecord) -> StoreResult<()>;
    async fn get_submission(&self, id: &str) -> StoreResult<Option<SubmissionRecord>>;
    async fn list_submissions(&self, session_id: &str) -> StoreResult<Vec<SubmissionRecord>>;
    async fn list_gradings(&self, submission_id: &str) -> StoreResult<Vec<GradingRecord>>;

    async fn insert_replay(&self, r: &ReplayRecord) -> StoreResult<()>;
    async fn get_replay(&self, id: &str) -> StoreResult<Option<ReplayRecord>>;
    async fn list_replays(&self, session_id: &str) -> StoreResult<Vec<ReplayRecord>>;
    /// Active replays whose window has closed.
    async fn due_replays(&self, now_ms: u64) -> StoreResult<Vec<ReplayRecord>>;
    /// `active` → `expired`; `false` if it was not active.
    async fn expire_replay(&self, id: &str) -> StoreResult<bool>;

    /// Appends one entry to a session's document log. An `idx` already
    /// taken (another process appended it) is a conflict.
    async fn append_doc_log(&self, e: &DocLogRecord) -> StoreResult<()>;
    /// The session's log entries with `idx <= upto` (all without it), in
    /// order.
    async fn doc_log(&self, session_id: &str, upto: Option<u64>) -> StoreResult<Vec<DocLogRecord>>;
    /// The session's log entries with `after < idx <= upto` (from the
    /// start without `after`), in order: the tail past a checkpoint.
    async fn doc_log_tail(
        &self,
        session_id: &str,
        after: Option<u64>,
        upto: u64,
    ) -> StoreResult<Vec<DocLogRecord>>;
    /// The session's checkpoint with the largest `idx <= at`.
    async fn doc_checkpoint(
        &self,
        session_id: &str,
        at: u64,
    ) -> StoreResult<Option<DocCheckpointRecord>>;
    /// The session's checkpoints, in `idx` order.
    async fn doc_checkpoints(&self, session_id: &str) -> StoreResult<Vec<DocCheckpointRecord>>;
    /// Stores checkpoints, in one transaction, each only while the
    /// session's would stay within `max_count` checkpoints and
    /// `max_bytes` of state; one already stored (same `idx`) is kept. The
    /// number stored. A checkpoint is a cache: its log entry must exist
    /// (a foreign key), and goes with it.
    async fn put_doc_checkpoints(
        &self,
        cps: &[DocCheckpointRecord],
        max_count: usize,
        max_bytes: u64,
    ) -> StoreResult<usize>;
    /// Deletes a session's document log, its checkpoints and notes, in one
    /// transaction (its retention window closed); the log entries deleted.
    async fn delete_room_data(&self, session_id: &str) -> StoreResult<u64>;
    /// The interviewers' private notes on a session (never the
    /// candidate's to read).
    async fn get_notes(&self, session_id: &str) -> StoreResult<Option<NotesRecord>>;
    /// Replaces the notes of a session.
    async fn put_notes(&self, n: &NotesRecord) -> StoreResult<()>;

    async fn insert_fork(&self, f: &ForkRecord) -> StoreResult<()>;
    async fn get_fork(&self, id: &str) -> StoreResult<Option<ForkRecord>>;
    async fn list_forks(&self, replay_id: &str) -> StoreResult<Vec<ForkRecord>>;
    async fn delete_fork(&self, id: &str) -> StoreResult<bool>;

    /// Holds one session for this process against every other process on
    /// the same store, until the hold is dropped: a Run, a Submit's
    /// capture, a replay and the end of a session work on its sandbox one
    /// at a time, whichever control process each request reached.
    /// `wait`: wait for the holder to let go (its Run ends within the
    /// round's wall limit); otherwise `None` at once while another holds
    /// it. Callers take their own process's lock first, so a process asks
    /// for a session once at a time. SQLite: granted at once (one process
    /// owns the file).
    async fn lock_session(&self, session_id: &str, wait: bool) -> StoreResult<Option<SessionHold>>;
}
