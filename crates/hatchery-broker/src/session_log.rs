//! What the broker needs of sessions, as one narrow trait: find the
//! session a sandbox belongs to, write its events (with the broker's own
//! rows, in one commit) and approvals. On one host the broker runs next to the
//! sessions service and calls it directly ([`Local`]); on the control role
//! (docs/sessions.md, "The broker on many hosts") reads go to the shared database and
//! writes to the session's owning host ([`remote`]).

use crate::store::BrokerWrite;
use hatchery_sessions::broker_hooks::Decision;
use hatchery_sessions::error::SessionError;
use hatchery_sessions::events::EventKind;
use hatchery_sessions::store::Session;
use hatchery_sessions::Sessions;
use std::sync::Arc;

pub mod remote;

#[async_trait::async_trait]
pub trait SessionLog: Send + Sync + 'static {
    /// The unfinished session whose current sandbox is `sandbox_id`.
    async fn session_for_sandbox(&self, sandbox_id: &str) -> Result<Option<Session>, SessionError>;
    /// Appends system events in one transaction; the seqs they got, in
    /// order (fewer, or none, when a remote write had already landed and
    /// its seqs are not known here).
    async fn record(&self, id: &str, kinds: Vec<EventKind>) -> Result<Vec<u64>, SessionError>;
    /// Appends system events and commits the broker's `joined` writes to
    /// its call record with them, in one transaction: here ([`Local`])
    /// the log's own; on the control role the owning host's, to which the
    /// write is posted with the events (docs/sessions.md, "What each
    /// commit guarantees"). `None`: `joined` declined (its call moved on
    /// meanwhile) and nothing was written.
    async fn record_joined(
        &self,
        id: &str,
        kinds: Vec<EventKind>,
        joined: &mut BrokerWrite,
    ) -> Result<Option<Vec<u64>>, SessionError>;
    /// Records a pending approval (once per id) and moves a running
    /// session to `waiting_approval`.
    async fn open_approval(
        &self,
        id: &str,
        approval_id: &str,
        action: &str,
        details: &str,
    ) -> Result<(), SessionError>;
    /// The decision on `approval_id`, once there is one.
    async fn approval_decision(
        &self,
        id: &str,
        approval_id: &str,
        after: u64,
    ) -> Result<Option<Decision>, SessionError>;
    /// The commit the session's checkout was made from.
    async fn checkout_commit(&self, id: &str) -> Result<Option<String>, SessionError>;
    /// Whether session `id`'s calls are another broker's to recover: with
    /// a shared call record, a host's broker sees every host's calls, and
    /// one another host owns may be mid-effect there.
    async fn owned_elsewhere(&self, id: &str) -> Result<bool, SessionError>;
}

/// The sessions service of this process.
pub struct Local(pub Arc<Sessions>);

#[async_trait::async_trait]
impl SessionLog for Local {
    async fn session_for_sandbox(&self, sandbox_id: &str) -> Result<Option<Session>, SessionError> {
        self.0.session_for_sandbox(sandbox_id).await
    }

    async fn record(&self, id: &str, kinds: Vec<EventKind>) -> Result<Vec<u64>, SessionError> {
        Ok(self
            .0
            .record(id, kinds)
            .await?
            .iter()
            .map(|e| e.seq)
            .collect())
    }

    async fn record_joined(
        &self,
        id: &str,
        kinds: Vec<EventKind>,
        joined: &mut BrokerWrite,
    ) -> Result<Option<Vec<u64>>, SessionError> {
        let evs = self.0.record_joined(id, kinds, joined).await?;
        Ok(evs.map(|evs| evs.iter().map(|e| e.seq).collect()))
    }

    async fn open_approval(
        &self,
        id: &str,
        approval_id: &str,
        action: &str,
        details: &str,
    ) -> Result<(), SessionError> {
        self.0.open_approval(id, approval_id, action, details).await
    }

    async fn approval_decision(
        &self,
        id: &str,
        approval_id: &str,
        after: u64,
    ) -> Result<Option<Decision>, SessionError> {
        self.0.approval_decision(id, approval_id, after).await
    }

    async fn checkout_commit(&self, id: &str) -> Result<Option<String>, SessionError> {
        self.0.checkout_commit(id).await
    }

    async fn owned_elsewhere(&self, id: &str) -> Result<bool, SessionError> {
        self.0.owned_elsewhere(id).await
    }
}
