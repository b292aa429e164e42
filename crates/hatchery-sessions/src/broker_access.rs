//! What the tool broker (`crates/hatchery-broker`) may do with sessions:
//! find the session a sandbox currently belongs to, append its events,
//! open an approval (moving the session to `waiting_approval`), and read
//! an approval's decision. Everything else stays crate-private.
//! Apart from broker_hooks.rs because these take [`Sessions`], which holds
//! the broker's plug-ins: those stay below the service, these above it.

use crate::broker_hooks::{reads, Decision};
use crate::error::SessionError;
use crate::events::{Actor, Event, EventKind};
use crate::service::Sessions;
use crate::state::SessionState;
use crate::store::{approval_request, Patch, Session};
use std::sync::Arc;

impl Sessions {
    /// The unfinished session whose current sandbox is `sandbox_id`.
    pub async fn session_for_sandbox(
        &self,
        sandbox_id: &str,
    ) -> Result<Option<Session>, SessionError> {
        reads::session_for_sandbox(&*self.core.store, sandbox_id).await
    }

    /// Whether session `id` belongs to another host: its broker calls are
    /// that host's to recover (with a shared broker record every host sees
    /// every call). A session not found is not another host's.
    pub async fn owned_elsewhere(&self, id: &str) -> Result<bool, SessionError> {
        match self.core.store.get(id).await {
            Ok(s) => Ok(s.host_id != self.core.store.host_id()),
            Err(crate::store::StoreError::NotFound(_)) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// The heads of the hash-chained logs of the sessions this host owns
    /// (anchored outside the database; docs/policy.md, "Anchors").
    pub async fn chain_heads(&self) -> Result<Vec<hatchery_audit::Head>, SessionError> {
        Ok(self.core.store.chain_heads().await?)
    }

    /// Appends system events and, in the same transaction, the broker's
    /// `joined` writes to its call record (and publishes the events to
    /// live streams once committed). `None`: `joined` declined (its call
    /// moved on meanwhile) and nothing was written.
    pub async fn record_joined(
        &self,
        id: &str,
        kinds: Vec<EventKind>,
        joined: &mut dyn hatchery_db::Joined,
    ) -> Result<Option<Vec<Event>>, SessionError> {
        let t = std::time::Instant::now();
        let events = kinds.into_iter().map(|k| (Actor::System, k)).collect();
        let out = self
            .core
            .store
            .append_joined(id, None, events, Patch::default(), joined)
            .await?;
        self.core
            .metrics
            .append_seconds
            .observe(t.elapsed().as_secs_f64());
        if let Some(evs) = &out {
            self.core.bus.publish(id, evs);
        }
        Ok(out)
    }

    /// Appends system events (and publishes them to live streams).
    pub async fn record(
        &self,
        id: &str,
        kinds: Vec<EventKind>,
    ) -> Result<Vec<Event>, SessionError> {
        self.core
            .append(
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
        let pending = self.core.store.pending_approval(id).await?;
        let fresh = pending.as_ref().map(|a| a.approval_id.as_str()) != Some(approval_id);
        let s = self.core.store.get(id).await?;
        let (extra, patch) = if fresh {
            let (ev, patch) = approval_request(approval_id, action, details);
            (vec![ev], patch)
        } else {
            (vec![], Patch::default())
        };
        let mut moved = false;
        if s.state == SessionState::Running {
            // The request and the move in one transaction: nobody reads the
            // approval pending while the session says `running`.
            match self
                .core
                .transition(id, SessionState::WaitingApproval, None, extra, patch)
                .await
            {
                Ok(_) => moved = true,
                Err(SessionError::Conflict(_)) => {}
                Err(e) => return Err(e),
            }
        }
        if !moved && fresh {
            let evs = self
                .core
                .store
                .request_approval(id, approval_id, action, details)
                .await?;
            self.core.bus.publish(id, &evs);
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
        reads::approval_decision(&*self.core.store, id, approval_id, after).await
    }

    /// The commit the session's checkout was made from.
    pub async fn checkout_commit(&self, id: &str) -> Result<Option<String>, SessionError> {
        reads::checkout_commit(&*self.core.store, id).await
    }
}
