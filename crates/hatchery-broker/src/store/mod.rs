//! The broker's own record of every call, keyed by (session, seq): its
//! tables `broker_calls`, `broker_epochs` and `broker_runners` in the
//! deployment's one database (hatchery-db: DATA_DIR/hatchery.db, or the
//! shared PostgreSQL on `--db postgres://`, where a session that moves to
//! another host finds the calls already made). The SQL is the same on both
//! (`db.rs`), the schema one numbered migration set (`schema.rs`), and one
//! suite checks the contract on both (`conformance.rs`).
//!
//! A call row is written before anything else happens for that key, and it
//! moves through
//! `awaiting_approval → pending → executing → done | failed | needs_review`
//! (or straight to `denied`); every update names the states it may move
//! from, so two racing requests cannot both take a call into `executing`.

mod db;
mod joined;
pub mod schema;

#[cfg(test)]
mod conformance;

pub use db::BrokerStore;
pub use joined::{Advance, BrokerWrite, Decoder, Insert, Refs, SetRef};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database refused or failed a statement; `what` names what was
    /// being done.
    #[error("broker store: {what}: {source}")]
    Db {
        what: &'static str,
        #[source]
        source: hatchery_db::DbError,
    },
    #[error("broker store: {0}")]
    Schema(#[source] hatchery_db::MigrateError),
    /// `epoch_for` lost every race for an epoch number.
    #[error("broker store: epoch for sandbox {0}: still contended")]
    Contended(String),
}

impl StoreError {
    /// The database is not reachable now (retryable, answered 503).
    pub fn unavailable(&self) -> bool {
        match self {
            StoreError::Db { source, .. } => source.unavailable(),
            StoreError::Schema(e) => e.unavailable(),
            _ => false,
        }
    }
}

hatchery_db::names! {
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
    #[serde(rename_all = "snake_case")]
    pub enum CallState {
        AwaitingApproval = "awaiting_approval",
        #[default]
        Pending = "pending",
        Executing = "executing",
        Done = "done",
        Failed = "failed",
        Denied = "denied",
        NeedsReview = "needs_review",
    }
}

impl CallState {
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

hatchery_db::record! {
    /// A row of `broker_calls`, read and inserted by its field names.
    #[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
    pub struct Call in "broker_calls" {
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
}

/// What an [`BrokerStore::advance_recorded`] writes besides the state.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Recorded {
    pub effect: Option<String>,
    pub output: Option<String>,
    pub event_seq: Option<u64>,
    pub result_event_seq: Option<u64>,
    /// The process taking the call into `executing`.
    pub runner: Option<String>,
    pub review_event_seq: Option<u64>,
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
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

pub(crate) fn now() -> String {
    hatchery_audit::event::now_rfc3339()
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
        let [calls, arg_bytes, awaiting_approval] =
            [calls, arg_bytes, awaiting].map(|n| n.max(0) as u64);
        CallUsage {
            calls,
            arg_bytes,
            awaiting_approval,
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
            created_at: t.clone(),
            updated_at: t,
            ..Default::default()
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
            for &to in CallState::ALL {
                assert!(!from.valid_transition(to), "{from:?} -> {to:?}");
            }
        }
    }
}
