//! The broker's own record of every call, keyed by (session, seq): in
//! DATA_DIR/broker.db (SQLite, `sqlite.rs`) on a single host, or in the
//! shared PostgreSQL database (`pg.rs`, tables `broker_calls` and
//! `broker_epochs`) when the daemon runs with `--db postgres://`, so that a
//! session that moves to another host finds the calls already made. Both
//! keep one contract, checked by one suite (`conformance.rs`).
//!
//! A call row is written before anything else happens for that key, and it
//! moves through
//! `awaiting_approval → pending → executing → done | failed | needs_review`
//! (or straight to `denied`); every update names the states it may move
//! from, so two racing requests cannot both take a call into `executing`.

mod pg;
mod sqlite;

#[cfg(test)]
mod conformance;

use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("broker store: {0}")]
    Db(#[from] rusqlite::Error),
    /// The shared database refused or failed a statement; the message
    /// names what was being done.
    #[error("broker store (postgres): {0}")]
    Pg(String),
    /// The shared database is not reachable now (retryable).
    #[error("broker store unavailable: {0}")]
    Unavailable(String),
    #[error("broker store task: {0}")]
    Task(String),
    #[error("broker store: unknown call state {0:?}")]
    Corrupt(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallState {
    AwaitingApproval,
    Pending,
    Executing,
    Done,
    Failed,
    Denied,
    NeedsReview,
}

impl CallState {
    pub fn as_str(self) -> &'static str {
        match self {
            CallState::AwaitingApproval => "awaiting_approval",
            CallState::Pending => "pending",
            CallState::Executing => "executing",
            CallState::Done => "done",
            CallState::Failed => "failed",
            CallState::Denied => "denied",
            CallState::NeedsReview => "needs_review",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        use CallState::*;
        [
            AwaitingApproval,
            Pending,
            Executing,
            Done,
            Failed,
            Denied,
            NeedsReview,
        ]
        .into_iter()
        .find(|c| c.as_str() == s)
    }
    pub fn is_final(self) -> bool {
        matches!(
            self,
            CallState::Done | CallState::Failed | CallState::Denied | CallState::NeedsReview
        )
    }
    /// The graph: which states a call may move to from `self`.
    pub fn valid_transition(self, to: CallState) -> bool {
        use CallState::*;
        matches!(
            (self, to),
            (AwaitingApproval, Pending)
                | (AwaitingApproval, Denied)
                | (Pending, Executing)
                // An effect-free tool (`noop`): its result is known
                // before anything happens.
                | (Pending, Done)
                | (Pending, Failed)
                | (Executing, Done)
                | (Executing, Failed)
                | (Executing, NeedsReview)
                // An operator's resolution (POST .../tool-calls/{seq}/resolve).
                | (NeedsReview, Done)
                | (NeedsReview, Failed)
        )
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub session_id: String,
    pub seq: u64,
    pub epoch: u64,
    pub tool: String,
    pub args_sha256: String,
    pub args: String,
    pub state: CallState,
    pub decision: String,
    pub rule_id: Option<String>,
    pub approval_id: Option<String>,
    /// The session event seq of the call's `broker_call` event, once written.
    pub event_seq: Option<u64>,
    /// The seq of its `broker_result` event, once written.
    pub result_event_seq: Option<u64>,
    /// What the effect is about to do (JSON), written before it starts.
    pub effect: Option<String>,
    pub output: Option<String>,
    /// The seq of the `broker_call_resolved` event of an operator's
    /// resolution of a `needs_review` call.
    pub review_event_seq: Option<u64>,
    /// The broker process that took the call into `executing` (its
    /// [`Runner`](crate::runner) id): while that process is alive, no
    /// other one resolves the call as stopped mid-effect.
    pub runner: Option<String>,
    pub created_at: String,
    pub updated_at: String,
}

/// What an [`BrokerStore::advance_recorded`] writes besides the state.
#[derive(Debug, Default)]
pub struct Recorded {
    pub effect: Option<String>,
    pub output: Option<String>,
    pub event_seq: Option<u64>,
    pub result_event_seq: Option<u64>,
    /// The process taking the call into `executing`.
    pub runner: Option<String>,
}

/// What `begin` found or made.
#[derive(Debug)]
pub enum Begin {
    New(Call),
    Existing(Call),
    /// The key is taken by a call with other arguments or another tool.
    Conflict(Call),
}

impl Begin {
    /// What `begin` answers when the key is taken by `old`.
    fn taken(old: Call, new: &Call) -> Begin {
        if old.args_sha256 == new.args_sha256 && old.tool == new.tool {
            Begin::Existing(old)
        } else {
            Begin::Conflict(old)
        }
    }
}

/// Which of a call's events a seq is stored for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventRef {
    /// The `broker_call` event written before the effect.
    Call,
    /// The event with the call's result.
    Result,
    /// The `broker_call_resolved` event of a reviewed call.
    Review,
}

impl EventRef {
    /// The column the seq goes in (the same name on both backends).
    fn column(self) -> &'static str {
        match self {
            EventRef::Call => "event_seq",
            EventRef::Result => "result_event_seq",
            EventRef::Review => "review_event_seq",
        }
    }
}

/// One of the two backends; an enum rather than a trait object because
/// there are exactly two and the methods are all async.
#[derive(Clone)]
enum Backend {
    Sqlite(sqlite::SqliteBroker),
    Pg(pg::PgBroker),
}

#[derive(Clone)]
pub struct BrokerStore {
    backend: Backend,
}

pub(crate) fn now() -> String {
    hatchery_audit::event::now_rfc3339()
}

/// Runs the same call on whichever backend the store has.
macro_rules! dispatch {
    ($self:ident . $m:ident ( $($a:expr),* )) => {
        match &$self.backend {
            Backend::Sqlite(b) => b.$m($($a),*).await,
            Backend::Pg(b) => b.$m($($a),*).await,
        }
    };
}

impl BrokerStore {
    /// DATA_DIR/broker.db (or any SQLite file), migrated.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Ok(BrokerStore {
            backend: Backend::Sqlite(sqlite::SqliteBroker::open(path)?),
        })
    }

    pub fn open_in_memory() -> Result<Self, StoreError> {
        Ok(BrokerStore {
            backend: Backend::Sqlite(sqlite::SqliteBroker::open_in_memory()?),
        })
    }

    /// The shared PostgreSQL database at `dsn` (a `postgres://` URL or a
    /// libpq string), through a pool of at most `pool_size` connections;
    /// runs the broker's migrations first. `Unavailable` when the database
    /// is not reachable (the daemon retries that at start).
    pub async fn postgres(dsn: &str, pool_size: usize) -> Result<BrokerStore, StoreError> {
        Ok(BrokerStore {
            backend: Backend::Pg(pg::PgBroker::connect(dsn, pool_size).await?),
        })
    }

    /// "sqlite" or "postgres", for logs.
    pub fn backend(&self) -> &'static str {
        match self.backend {
            Backend::Sqlite(_) => "sqlite",
            Backend::Pg(_) => "postgres",
        }
    }

    /// The epoch of `sandbox_id` in `session_id`: known ones keep theirs;
    /// a new sandbox (the session was resumed or forked) gets the next one.
    pub async fn epoch_for(&self, session_id: &str, sandbox_id: &str) -> Result<u64, StoreError> {
        dispatch!(self.epoch_for(session_id, sandbox_id))
    }

    /// The epoch a sandbox had, if the broker has seen it.
    pub async fn known_epoch(&self, sandbox_id: &str) -> Result<Option<(String, u64)>, StoreError> {
        dispatch!(self.known_epoch(sandbox_id))
    }

    /// Records the call under its key unless the key is taken; atomically,
    /// so two racing first attempts make one row (and one `New`).
    pub async fn begin(&self, new: Call) -> Result<Begin, StoreError> {
        dispatch!(self.begin(new))
    }

    pub async fn get(&self, session_id: &str, seq: u64) -> Result<Option<Call>, StoreError> {
        dispatch!(self.get(session_id, seq))
    }

    /// Stores the seq of one of the call's events, once: a column already
    /// set keeps its value (a retry never moves it).
    pub async fn set_event_ref(
        &self,
        which: EventRef,
        session_id: &str,
        seq: u64,
        ev: u64,
    ) -> Result<(), StoreError> {
        dispatch!(self.set_event_ref(which, session_id, seq, ev))
    }

    /// [`advance`](Self::advance) that also stores the seqs of the events
    /// just written for the call, in the same transaction (one commit
    /// instead of two or three).
    pub async fn advance_recorded(
        &self,
        session_id: &str,
        seq: u64,
        from: CallState,
        to: CallState,
        r: Recorded,
    ) -> Result<Option<Call>, StoreError> {
        debug_assert!(from.valid_transition(to), "{from:?} -> {to:?}");
        dispatch!(self.advance_recorded(session_id, seq, from, to, r))
    }

    /// Moves the call to `to` if it is in `from`; `None` when it was not
    /// (someone else moved it first). `effect`/`output` are set if given.
    pub async fn advance(
        &self,
        session_id: &str,
        seq: u64,
        from: CallState,
        to: CallState,
        effect: Option<String>,
        output: Option<String>,
    ) -> Result<Option<Call>, StoreError> {
        debug_assert!(from.valid_transition(to), "{from:?} -> {to:?}");
        let r = Recorded {
            effect,
            output,
            ..Default::default()
        };
        dispatch!(self.advance_recorded(session_id, seq, from, to, r))
    }

    /// Calls caught in `executing` (the process stopped mid-effect).
    pub async fn executing(&self) -> Result<Vec<Call>, StoreError> {
        dispatch!(self.executing())
    }

    /// Records that broker process `runner` is alive for `ttl_s` more
    /// seconds, by the database's clock. A no-op on SQLite, whose file
    /// only one process uses.
    pub async fn heartbeat(&self, runner: &str, ttl_s: u32) -> Result<(), StoreError> {
        match &self.backend {
            Backend::Sqlite(_) => Ok(()),
            Backend::Pg(p) => p.heartbeat(runner, ttl_s).await,
        }
    }

    /// Whether broker process `runner` renewed its heartbeat recently
    /// enough. On SQLite never: the only process using the file is the
    /// one asking, and it knows its own id (crate::runner).
    pub async fn runner_alive(&self, runner: &str) -> Result<bool, StoreError> {
        match &self.backend {
            Backend::Sqlite(_) => Ok(false),
            Backend::Pg(p) => p.runner_alive(runner).await,
        }
    }

    /// Every call of a session, in seq order (tests and the CLI).
    pub async fn calls(&self, session_id: &str) -> Result<Vec<Call>, StoreError> {
        dispatch!(self.calls(session_id))
    }

    /// What a session's calls hold: how many, their stored argument
    /// bytes, how many wait for an approval (the per-session caps).
    pub async fn usage(&self, session_id: &str) -> Result<CallUsage, StoreError> {
        dispatch!(self.usage(session_id))
    }
}

/// A session's calls in the record (for its caps and its view).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallUsage {
    pub calls: u64,
    pub arg_bytes: u64,
    pub awaiting_approval: u64,
}

impl CallUsage {
    fn from_row(calls: i64, arg_bytes: i64, awaiting: i64) -> CallUsage {
        CallUsage {
            calls: calls.max(0) as u64,
            arg_bytes: arg_bytes.max(0) as u64,
            awaiting_approval: awaiting.max(0) as u64,
        }
    }
}

impl Call {
    pub fn new(
        session_id: &str,
        seq: u64,
        epoch: u64,
        tool: &str,
        args: String,
        args_sha256: String,
    ) -> Call {
        let t = now();
        Call {
            session_id: session_id.into(),
            seq,
            epoch,
            tool: tool.into(),
            args_sha256,
            args,
            state: CallState::Pending,
            decision: String::new(),
            rule_id: None,
            approval_id: None,
            event_seq: None,
            result_event_seq: None,
            effect: None,
            output: None,
            review_event_seq: None,
            runner: None,
            created_at: t.clone(),
            updated_at: t,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::CallState;

    #[test]
    fn transitions() {
        use CallState::*;
        assert!(Pending.valid_transition(Executing));
        assert!(!Done.valid_transition(Executing));
        assert!(!Executing.valid_transition(Pending));
        assert!(NeedsReview.is_final());
        assert!(NeedsReview.valid_transition(Done) && NeedsReview.valid_transition(Failed));
        assert!(!NeedsReview.valid_transition(Executing));
        // A final state other than needs_review is never left.
        for from in [Done, Failed, Denied] {
            for to in [
                AwaitingApproval,
                Pending,
                Executing,
                Done,
                Failed,
                Denied,
                NeedsReview,
            ] {
                assert!(!from.valid_transition(to), "{from:?} -> {to:?}");
            }
        }
    }
}
