//! The session store: sessions, their event log, approvals and blobs,
//! behind an async trait, kept in the deployment's one database
//! (hatchery-db: the SQLite file `DATA_DIR/hatchery.db`, or PostgreSQL)
//! by [`DbSessionStore`], whose queries (store/db.rs) are the same SQL on
//! both. The tables and their one migration set are in
//! hatchery-sessions-schema (`hatchery audit verify` reads them too).
//!
//! Ownership and fencing: every session belongs to one host (`host_id`)
//! under an `epoch`. A store is opened as one host, and each write for a
//! session checks, in the write's own transaction, that the session still
//! belongs to that host; [`SessionStore::take_over`] moves a lost host's
//! sessions to another and bumps their epochs, so the old host's late
//! writes fail with [`StoreError::Fenced`] and never commit.

pub(crate) mod authorised;
pub mod chain;
pub mod conformance;
mod db;

pub use db::{DbSessionStore, SqliteStore, IMPORT};
pub use hatchery_sessions_schema::SCHEMA;

/// The host id of a single-host daemon (and of rows written before
/// ownership existed: SQLite migration 3's default).
pub const LOCAL_HOST: &str = "local";

pub const MAX_HOST_ID_BYTES: usize = 64;

/// Checks a host id with the daemon's own rule (hatchery-store's
/// `valid_host_id`, which `--host-id` must pass): 1..=64 bytes of `a-z`,
/// `0-9` and `-`, not starting with `-`.
pub fn check_host_id(h: &str) -> Result<(), StoreError> {
    let ok = (1..=MAX_HOST_ID_BYTES).contains(&h.len())
        && !h.starts_with('-')
        && h.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !ok {
        let rule = format!("1 to {MAX_HOST_ID_BYTES} characters of a-z 0-9 -, not starting with -");
        return Err(StoreError::Config(format!("host id {h:?}: {rule}")));
    }
    Ok(())
}

use crate::events::{Actor, Event, EventKind};
use crate::state::SessionState;
use async_trait::async_trait;
use hatchery_db::Alone;
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("session {0} not found")]
    NotFound(String),
    #[error("session {id} is {current}, not one of the states this change may start from")]
    StateConflict { id: String, current: SessionState },
    #[error("approval {0} not found or already decided")]
    ApprovalNotFound(String),
    /// The session belongs to another host now (it was taken over): this
    /// host's write was refused and nothing of it committed.
    #[error("session {id} is owned by host {owner} (epoch {epoch}), not this host")]
    Fenced {
        id: String,
        owner: String,
        epoch: u64,
    },
    /// The database cannot be reached (down, restarting, pool exhausted,
    /// a locked file): retryable; the API answers 503 with Retry-After.
    #[error("session store unavailable: {0}")]
    Unavailable(String),
    #[error("session store configuration: {0}")]
    Config(String),
    #[error("session store")]
    Db(#[source] hatchery_db::DbError),
    /// The schema could not be brought up to date (or is newer than this
    /// build).
    #[error("session store schema")]
    Schema(#[source] hatchery_db::MigrateError),
    /// A stored row (or an event to store) that does not decode.
    #[error("session store data: {0}")]
    Data(String),
}

/// A database error as `Unavailable` when it is retryable, else as the
/// variant given.
macro_rules! from_db_errors {
    ($($e:ty => $variant:ident),*) => {$(
        impl From<$e> for StoreError {
            fn from(e: $e) -> Self {
                match e.unavailable() {
                    true => StoreError::Unavailable(e.to_string()),
                    false => StoreError::$variant(e),
                }
            }
        }
    )*};
}
from_db_errors!(hatchery_db::DbError => Db, hatchery_db::MigrateError => Schema);

/// What the caller asked for, normalised (the idempotency hash covers it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionSpec {
    pub repo: String,
    #[serde(rename = "ref")]
    pub git_ref: String,
    pub task: String,
    pub policy_id: String,
    pub policy_version: u32,
    pub budget_tokens: u64,
    pub budget_usd_cents: u64,
    pub budget_wall_s: u64,
    pub template: String,
    pub agent: AgentSpec,
    pub env: std::collections::BTreeMap<String, String>,
    /// Kept in the spec's JSON: sessions stored before it read as empty.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub metadata: std::collections::BTreeMap<String, String>,
    /// The tenant whose key created the session (issue 36), from the key,
    /// never from the body; `None` for the operator's. Also written to
    /// the row's `tenant` column, which a tenant's list filters on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The environment version the session starts from (forked from its
    /// snapshot, then the delta to `ref`); absent for a bare repository.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<EnvPin>,
}

/// What a session that starts from an environment pins: the version and
/// everything the runner needs of it, kept in the session's spec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EnvPin {
    pub environment_id: String,
    pub version: u64,
    pub snapshot_id: String,
    pub base_commit: String,
}

/// Which agent runs and where it finds its model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AgentSpec {
    /// `reference` (Hatchery's own agent) or `command` (anything else,
    /// started with `command`).
    pub kind: String,
    /// The model endpoint as the sandbox sees it (an OpenAI-compatible
    /// base URL, normally a host service such as http://127.0.0.1:9100/v1).
    pub model_url: String,
    pub model: String,
    /// Most model calls the reference agent makes.
    pub max_steps: u32,
    /// For `kind: command`: the command line, run in the checkout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
}

hatchery_db::record! {
    /// A row of `sessions`, read by column name (`create` writes the row's
    /// `repo` and `request_hash` too; `ord` is the database's).
    #[derive(Debug, Clone, PartialEq)]
    pub struct Session in "sessions" {
        pub id: String,
        pub spec: SessionSpec,
        pub state: SessionState,
        pub idempotency_key: Option<String>,
        pub created_at: String,
        pub started_at: Option<String>,
        pub ended_at: Option<String>,
        pub reason: Option<String>,
        pub spend_tokens: u64,
        pub spend_usd_cents: u64,
        /// Seconds the session has held a sandbox, up to its last release.
        pub spend_wall_s: u64,
        pub sandbox_id: Option<String>,
        pub process_id: Option<String>,
        pub snapshot_id: Option<String>,
        pub review_snapshot_id: Option<String>,
        /// What the agent waits for (`message`), if anything.
        pub waiting: Option<String>,
        /// Offset in the agent's output up to which every line is handled.
        pub output_offset: u64,
        /// The highest agent message number handled (dedupes re-reads).
        pub agent_seq: u64,
        /// Seq of the last steering message handed to the agent.
        pub delivered_seq: u64,
        pub cancel_requested: bool,
        pub last_seq: u64,
        /// Agent messages up to this number were handled before the session
        /// was last rewound to a checkpoint: the re-run agent emits them again
        /// and they are not handled twice (0: never rewound).
        pub replay_through: u64,
        /// The host that owns the session (only it may write).
        pub host_id: String,
        /// Ownership epoch: 1 at create, +1 at each take-over; never shrinks.
        pub epoch: u64,
    }
}

hatchery_db::named!(SessionState, as_str, parse);

hatchery_db::json!(SessionSpec, "a session spec (JSON)");

/// Fields a runner step changes (None: leave as is).
#[derive(Debug, Default, Clone)]
pub struct Patch {
    pub sandbox_id: Option<Option<String>>,
    pub process_id: Option<Option<String>>,
    pub snapshot_id: Option<Option<String>>,
    pub review_snapshot_id: Option<Option<String>>,
    pub waiting: Option<Option<String>>,
    pub delivered_seq: Option<u64>,
    pub add_tokens: u64,
    pub add_usd_cents: u64,
    pub add_wall_s: u64,
    pub cancel_requested: Option<bool>,
    /// Moves the session to this version of its policy.
    pub policy_version: Option<u32>,
    /// A pending approval to record: (approval_id, action, details).
    pub new_approval: Option<(String, String, String)>,
    /// Back to a checkpoint: the agent's output is read again from here,
    /// what was delivered after it is delivered again, and
    /// `replay_through` becomes the highest message handled so far.
    pub rewind: Option<Rewind>,
    /// What a numbered agent message asked, kept to compare its re-run
    /// with after a resume from a checkpoint. Replaces the number's earlier
    /// record: only a diverged re-run that was let go on (by policy or a
    /// person) writes one for a number already kept.
    pub agent_line: Option<AgentLine>,
}

/// What agent message `n` asked: its event's kind and the part of it that
/// decides its effect (`crate::replay::asked`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentLine {
    pub n: u64,
    pub kind: String,
    pub asked: String,
}

/// Where a checkpoint left the session's reading of its agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rewind {
    pub output_offset: u64,
    pub delivered_seq: u64,
}

hatchery_db::record! {
    // A row of `session_approvals` read with its `id` as `approval_id`: a
    // query's result, not a `Record` (its INSERT would name `approval_id`).
    // No doc comment: it would become the API schema's description.
    #[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
    pub struct Approval {
        pub approval_id: String,
        pub action: String,
        pub details: String,
        pub state: String,
        pub created_at: String,
    }
}

/// A decision on an approval, as [`SessionStore::decide_approval`]
/// records it.
#[derive(Debug, Clone, Copy)]
pub struct Decided<'a> {
    pub decision: &'a str,
    pub note: &'a str,
    pub remember: Option<&'a str>,
    pub actor: Actor,
}

impl<'a> Decided<'a> {
    /// A person's decision through the API, remembering nothing.
    pub fn by_user(decision: &'a str, note: &'a str) -> Self {
        Decided {
            decision,
            note,
            remember: None,
            actor: Actor::User,
        }
    }
}

/// What one session holds in the store (computed on read, from the rows).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StorageUsage {
    pub events: u64,
    /// Bytes of the events' stored JSON.
    pub event_bytes: u64,
    pub blobs: u64,
    pub blob_bytes: u64,
    /// Bytes of the agent's events' JSON alone (actor `agent`).
    pub agent_event_bytes: u64,
    pub open_approvals: u64,
    /// The caps whose `output_capped` marker the log holds.
    pub capped: Vec<String>,
}

impl StorageUsage {
    /// What the runner counts against the session's output cap: the
    /// agent's events and every blob (after a restart the blobs of the
    /// system's events, the final diff only, count too: a cap errs low).
    pub fn output_bytes(&self) -> u64 {
        self.agent_event_bytes.saturating_add(self.blob_bytes)
    }
}

#[derive(Debug)]
pub enum CreateOutcome {
    Created(Session, Event),
    /// The same idempotency key with the same request.
    Existing(Session),
    /// The same idempotency key with another request.
    KeyConflict(String),
    /// The tenant's limit has no room for this session's budget: nothing
    /// was stored.
    NoRoom(NoRoom),
}

/// A tenant's limits a new session's budget is reserved against (issue
/// 36), in the transaction that stores the session. `None`: unlimited.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TenantLimits {
    pub tokens: Option<u64>,
    pub usd_cents: Option<u64>,
    pub concurrent_sessions: Option<u64>,
    pub wall_s: Option<u64>,
}

/// Which limit refused a session, with what was held and asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoRoom {
    pub limit: &'static str,
    pub max: u64,
    /// What the tenant holds now: its unfinished sessions' budgets plus
    /// what its finished ones spent.
    pub held: u64,
    pub asked: u64,
}

impl TenantLimits {
    /// The first limit that `held` (tokens, cents, sessions, wall) plus
    /// `asked` would pass.
    pub fn refuse(&self, held: [u64; 4], asked: [u64; 4]) -> Option<NoRoom> {
        let limits = [
            ("tokens", self.tokens),
            ("usd_cents", self.usd_cents),
            ("concurrent_sessions", self.concurrent_sessions),
            ("wall_clock_seconds", self.wall_s),
        ];
        limits
            .into_iter()
            .zip(held.into_iter().zip(asked))
            .find_map(|((limit, max), (held, asked))| {
                let max = max?;
                (held.saturating_add(asked) > max).then_some(NoRoom {
                    limit,
                    max,
                    held,
                    asked,
                })
            })
    }
}

#[derive(Debug, Default, Clone)]
pub struct ListFilter {
    pub state: Option<SessionState>,
    pub repo: Option<String>,
    /// Sessions created after this id's row (keyset pagination).
    pub after_id: Option<String>,
    /// Only this tenant's sessions (a tenant key's list).
    pub tenant: Option<String>,
    pub limit: usize,
}

/// One event to append, with its actor.
pub type NewEvent = (Actor, EventKind);

/// The event and row of a new pending approval: appended alone
/// ([`SessionStore::request_approval`]) or with the move to
/// `waiting_approval` in one transaction, so no reader sees the approval
/// pending while the session still says `running`.
pub fn approval_request(approval_id: &str, action: &str, details: &str) -> (NewEvent, Patch) {
    let patch = Patch {
        new_approval: Some((approval_id.into(), action.into(), details.into())),
        ..Patch::default()
    };
    let ev = EventKind::ApprovalRequested {
        approval_id: approval_id.into(),
        action: action.into(),
        details: details.into(),
    };
    ((Actor::Agent, ev), patch)
}

#[async_trait]
pub trait SessionStore: Send + Sync + 'static {
    /// Stores a queued session and its first event, in one transaction;
    /// with an idempotency key seen before, compares `request_hash`.
    /// Stores a new session (not a tenant's, or a tenant's without limits).
    async fn create(
        &self,
        id: &str,
        spec: &SessionSpec,
        idempotency_key: Option<&str>,
        request_hash: &str,
    ) -> Result<CreateOutcome, StoreError> {
        self.create_within(id, spec, idempotency_key, request_hash, None)
            .await
    }
    /// Stores a new session; for a tenant's (`spec.tenant`) with `limits`,
    /// only if they have room for its budget, counted in the same
    /// transaction: the tenant's unfinished sessions hold their budgets,
    /// its finished ones what they spent (so an ended session has given
    /// back what it did not use). Creates of one tenant take turns.
    async fn create_within(
        &self,
        id: &str,
        spec: &SessionSpec,
        idempotency_key: Option<&str>,
        request_hash: &str,
        limits: Option<&TenantLimits>,
    ) -> Result<CreateOutcome, StoreError>;
    async fn get(&self, id: &str) -> Result<Session, StoreError>;
    async fn list(&self, f: &ListFilter) -> Result<Vec<Session>, StoreError>;
    /// This host's sessions not completed, failed or cancelled (for
    /// recovery).
    async fn unfinished(&self) -> Result<Vec<Session>, StoreError>;
    /// The unfinished session, on any host, whose current sandbox is
    /// `sandbox_id` (the control role's broker finds a call's session so).
    async fn with_sandbox(&self, sandbox_id: &str) -> Result<Option<Session>, StoreError>;
    /// How many of `tenant`'s sessions are unfinished, on any host (a
    /// tenant is not deleted while it has one).
    async fn unfinished_of_tenant(&self, tenant: &str) -> Result<u64, StoreError>;
    /// Appends events in one transaction that assigns the next seqs, and
    /// applies `patch` in it.
    async fn append(
        &self,
        id: &str,
        events: Vec<NewEvent>,
        patch: Patch,
    ) -> Result<Vec<Event>, StoreError> {
        let out = self
            .append_joined(id, None, events, patch, &mut Alone)
            .await?;
        Ok(out.unwrap_or_default())
    }
    /// Appends `events` and applies `patch`, unless a write with the same
    /// `key` (a delivery id the sender chose) was made to this session
    /// before (then `None`): the key is recorded in the same transaction,
    /// so a sender that cannot tell whether its write landed may send it
    /// again, to this host or to the session's next owner, and it lands
    /// once.
    async fn append_once(
        &self,
        id: &str,
        key: &str,
        events: Vec<NewEvent>,
        patch: Patch,
    ) -> Result<Option<Vec<Event>>, StoreError> {
        self.append_joined(id, Some(key), events, patch, &mut Alone)
            .await
    }
    /// Appends `events` and applies `patch` (once per `key`, as
    /// [`append_once`](Self::append_once), when one is given), then runs
    /// another product's `joined` writes in the same transaction: both
    /// commit or neither. `None` when nothing was written: the key was
    /// seen, or `joined` declined (it lost a race), which rolls the events
    /// back too.
    async fn append_joined(
        &self,
        id: &str,
        key: Option<&str>,
        events: Vec<NewEvent>,
        patch: Patch,
        joined: &mut dyn hatchery_db::Joined,
    ) -> Result<Option<Vec<Event>>, StoreError>;
    /// Appends what one line of agent output produced, unless the line
    /// (which ends at `line_end`) was handled before (then `None`); records
    /// the offset, and `n` (the agent's message number) in the same
    /// transaction, so a re-read after a crash neither loses nor repeats.
    async fn append_agent(
        &self,
        id: &str,
        line_end: u64,
        n: Option<u64>,
        events: Vec<NewEvent>,
        patch: Patch,
    ) -> Result<Option<Vec<Event>>, StoreError>;
    /// Moves the session to `to` if it is in one of `from`, appending a
    /// `state_changed` event (and `extra` before it) in the same transaction.
    async fn transition(
        &self,
        id: &str,
        from: &[SessionState],
        to: SessionState,
        reason: Option<String>,
        extra: Vec<NewEvent>,
        patch: Patch,
    ) -> Result<(Session, Vec<Event>), StoreError>;
    async fn events(&self, id: &str, after: u64, limit: usize) -> Result<Vec<Event>, StoreError>;
    /// The head (newest seq and its hash) of each hash-chained event log
    /// of the sessions this store's host owns, for anchoring outside the
    /// database (hatchery-audit anchor.rs).
    async fn chain_heads(&self) -> Result<Vec<hatchery_audit::Head>, StoreError>;
    /// What the agent must be handed after `after`: steering messages and
    /// approval decisions, in seq order.
    async fn deliverables_after(&self, id: &str, after: u64) -> Result<Vec<Event>, StoreError>;
    /// Appends only while the session is in one of `states` (checked in the
    /// same transaction).
    async fn append_if_state(
        &self,
        id: &str,
        states: &[SessionState],
        events: Vec<NewEvent>,
        patch: Patch,
    ) -> Result<Vec<Event>, StoreError>;
    async fn blob(&self, id: &str, blob_ref: &str) -> Result<Option<Vec<u8>>, StoreError>;
    /// What the session holds: events, blobs, open approvals, and which
    /// output caps it has reached (`NotFound` for an unknown session).
    async fn usage(&self, id: &str) -> Result<StorageUsage, StoreError>;
    /// Records a pending approval and its event.
    async fn request_approval(
        &self,
        id: &str,
        approval_id: &str,
        action: &str,
        details: &str,
    ) -> Result<Vec<Event>, StoreError> {
        let (ev, patch) = approval_request(approval_id, action, details);
        self.append(id, vec![ev], patch).await
    }
    async fn pending_approval(&self, id: &str) -> Result<Option<Approval>, StoreError>;
    /// What agent message `n` of the session asked, if it was recorded.
    async fn agent_line(&self, id: &str, n: u64) -> Result<Option<AgentLine>, StoreError>;
    /// One approval of the session, pending or decided.
    async fn approval(&self, id: &str, approval_id: &str) -> Result<Option<Approval>, StoreError>;
    /// Decides a pending approval and appends its event (by `actor`: the
    /// API caller, or the system when an egress hold times out).
    async fn decide_approval(
        &self,
        id: &str,
        approval_id: &str,
        decided: Decided<'_>,
    ) -> Result<Vec<Event>, StoreError>;
    /// Moves every unfinished session of `from_host` to `to_host` in one
    /// transaction: epoch + 1 and a `host_changed` event each. Only sessions
    /// still owned by `from_host` move, so of two sweepers at once one moves
    /// them and the other none. Returns (session id, new epoch).
    async fn take_over(
        &self,
        from_host: &str,
        to_host: &str,
        reason: &str,
    ) -> Result<Vec<(String, u64)>, StoreError>;
    /// Hands one unfinished session this host owns to `to_host` (a
    /// graceful stop or a drain): epoch + 1 and a `host_changed` event,
    /// in one transaction. `None` if the session is finished or not this
    /// host's (nothing written). After it, this host's writes for the
    /// session are fenced, as after [`SessionStore::take_over`].
    async fn hand_over(
        &self,
        id: &str,
        to_host: &str,
        reason: &str,
    ) -> Result<Option<u64>, StoreError>;
    /// The host this store writes as.
    fn host_id(&self) -> &str;
}

#[cfg(test)]
mod tests {
    #[test]
    fn host_ids_are_checked_at_the_boundary() {
        for ok in ["local", "host-a", "h2", &"a".repeat(64)] {
            assert!(super::check_host_id(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-a", "Host", "a b", "a_b", &"a".repeat(65)] {
            assert!(super::check_host_id(bad).is_err(), "{bad}");
        }
    }
}
