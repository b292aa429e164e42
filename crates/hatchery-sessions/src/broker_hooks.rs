//! What the tool broker (`crates/hatchery-broker`) may do with sessions:
//! find the session a sandbox currently belongs to, append its events,
//! open an approval (moving the session to `waiting_approval`), and read
//! an approval's decision. Everything else stays crate-private.

use crate::error::SessionError;
use crate::events::{Actor, Event, EventKind};
use crate::service::Sessions;
use crate::state::SessionState;
use crate::store::{Patch, Session};
use std::sync::Arc;

/// How an approval was decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub approved: bool,
    pub note: String,
}

impl Sessions {
    /// The unfinished session whose current sandbox is `sandbox_id`.
    pub async fn session_for_sandbox(
        &self,
        sandbox_id: &str,
    ) -> Result<Option<Session>, SessionError> {
        Ok(self
            .store
            .unfinished()
            .await?
            .into_iter()
            .find(|s| s.sandbox_id.as_deref() == Some(sandbox_id)))
    }

    /// Appends system events (and publishes them to live streams).
    pub async fn record(
        &self,
        id: &str,
        kinds: Vec<EventKind>,
    ) -> Result<Vec<Event>, SessionError> {
        self.append(
            id,
            kinds.into_iter().map(|k| (Actor::System, k)).collect(),
            Patch::default(),
        )
        .await
    }

    /// Records a pending approval with its event and moves a running
    /// session to `waiting_approval`. A second call with the same id adds
    /// nothing (the approval row is kept once; no second event).
    pub async fn open_approval(
        self: &Arc<Self>,
        id: &str,
        approval_id: &str,
        action: &str,
        details: &str,
    ) -> Result<(), SessionError> {
        let pending = self.store.pending_approval(id).await?;
        if pending.as_ref().map(|a| a.approval_id.as_str()) != Some(approval_id) {
            let evs = self
                .store
                .request_approval(id, approval_id, action, details)
                .await?;
            self.bus.publish(id, &evs);
        }
        let s = self.store.get(id).await?;
        if s.state == SessionState::Running {
            match self
                .transition(
                    id,
                    SessionState::WaitingApproval,
                    None,
                    vec![],
                    Patch::default(),
                )
                .await
            {
                Ok(_) | Err(SessionError::Conflict(_)) => {}
                Err(e) => return Err(e),
            }
        }
        self.nudge(id);
        Ok(())
    }

    /// The decision on `approval_id`, once there is one. `after` is a seq
    /// at or before its request (the scan starts there).
    pub async fn approval_decision(
        &self,
        id: &str,
        approval_id: &str,
        after: u64,
    ) -> Result<Option<Decision>, SessionError> {
        let mut from = after;
        loop {
            let page = self.store.events(id, from, 1000).await?;
            let Some(last) = page.last() else {
                return Ok(None);
            };
            from = last.seq;
            for e in &page {
                if let EventKind::ApprovalDecided {
                    approval_id: a,
                    decision,
                    note,
                } = &e.kind
                {
                    if a == approval_id {
                        return Ok(Some(Decision {
                            approved: decision == "approve",
                            note: note.clone(),
                        }));
                    }
                }
            }
        }
    }

    /// The commit the session's checkout was made from.
    pub async fn checkout_commit(&self, id: &str) -> Result<Option<String>, SessionError> {
        // It is among the first few events; look at the first page only.
        let page = self.store.events(id, 0, 100).await?;
        Ok(page.into_iter().find_map(|e| match e.kind {
            EventKind::RepoCheckedOut { commit, .. } => Some(commit),
            _ => None,
        }))
    }
}
