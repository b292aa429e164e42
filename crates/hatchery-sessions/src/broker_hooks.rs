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

/// What a session's log holds about one broker call: the control role's
/// broker, whose event posts reach the owner in their own commit, reads
/// the seqs of a post it repeated (its answer was lost) from here.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoggedCall {
    /// `broker_call`: its event seq, the tool, the arguments (canonical
    /// JSON, cut as logged) and the decision.
    pub call: Option<(u64, String, String, String)>,
    /// `broker_effect_started`: the effect's plan (the broker commits it
    /// before the effect starts).
    pub effect: Option<String>,
    /// `broker_result`: its event seq, the status and the output.
    pub result: Option<(u64, String, String)>,
}

/// The broker's record of a session's calls, for the session's view:
/// (calls, stored argument bytes); None when it cannot tell now.
#[async_trait::async_trait]
pub trait BrokerUsage: Send + Sync + 'static {
    async fn usage(&self, session: &str) -> Option<(u64, u64)>;
}

/// Whose writes a post carries with its events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JoinedFrom {
    /// The tool broker's call rows (`broker-events`).
    Broker,
    /// The model gateway's settle of a call (`model-events`).
    Gateway,
}

/// Reads back the writes a product in another process (the control
/// role's broker or gateway) posts with its events, for the owning host to
/// commit them in the same transaction as the events (set by the daemon:
/// those products' store code is not this crate's).
pub trait RemoteJoined: Send + Sync + 'static {
    /// The write, for a call of `session`; an error says why it is refused.
    fn decode(
        &self,
        session: &str,
        write: serde_json::Value,
    ) -> Result<Box<dyn hatchery_db::Joined>, String>;
}

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
        reads::session_for_sandbox(&*self.store, sandbox_id).await
    }

    /// Whether session `id` belongs to another host: its broker calls are
    /// that host's to recover (with a shared broker record every host sees
    /// every call). A session not found is not another host's.
    pub async fn owned_elsewhere(&self, id: &str) -> Result<bool, SessionError> {
        match self.store.get(id).await {
            Ok(s) => Ok(s.host_id != self.store.host_id()),
            Err(crate::store::StoreError::NotFound(_)) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// The heads of the hash-chained logs of the sessions this host owns
    /// (anchored outside the database; docs/policy.md, "Anchors").
    pub async fn chain_heads(&self) -> Result<Vec<hatchery_audit::Head>, SessionError> {
        Ok(self.store.chain_heads().await?)
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
            .store
            .append_joined(id, None, events, Patch::default(), joined)
            .await?;
        self.metrics
            .append_seconds
            .observe(t.elapsed().as_secs_f64());
        if let Some(evs) = &out {
            self.bus.publish(id, evs);
        }
        Ok(out)
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
        reads::approval_decision(&*self.store, id, approval_id, after).await
    }

    /// The commit the session's checkout was made from.
    pub async fn checkout_commit(&self, id: &str) -> Result<Option<String>, SessionError> {
        reads::checkout_commit(&*self.store, id).await
    }
}

/// The broker's reads of the shared log, over any session store: the
/// in-process broker reads through [`Sessions`], the control role's
/// (docs/sessions.md, "The broker on many hosts") from the shared database directly.
pub mod reads {
    use super::{Decision, LoggedCall};
    use crate::error::SessionError;
    use crate::events::EventKind;
    use crate::store::{Session, SessionStore};

    /// The unfinished session whose current sandbox is `sandbox_id`.
    pub async fn session_for_sandbox(
        store: &dyn SessionStore,
        sandbox_id: &str,
    ) -> Result<Option<Session>, SessionError> {
        Ok(store.with_sandbox(sandbox_id).await?)
    }

    pub async fn logged_broker_call(
        store: &dyn SessionStore,
        id: &str,
        call_seq: u64,
    ) -> Result<Option<LoggedCall>, SessionError> {
        let mut found = LoggedCall::default();
        let mut after = 0;
        loop {
            let page = store.events(id, after, 1000).await?;
            let Some(last) = page.last() else { break };
            after = last.seq;
            for e in page {
                match e.kind {
                    EventKind::BrokerCall {
                        call_seq: s,
                        tool,
                        arguments,
                        decision,
                        ..
                    } if s == call_seq => found.call = Some((e.seq, tool, arguments, decision)),
                    EventKind::BrokerEffectStarted {
                        call_seq: s,
                        detail,
                        ..
                    } if s == call_seq => found.effect = Some(detail),
                    EventKind::BrokerResult {
                        call_seq: s,
                        status,
                        output,
                        ..
                    } if s == call_seq => found.result = Some((e.seq, status, output)),
                    _ => {}
                }
            }
        }
        Ok((found != LoggedCall::default()).then_some(found))
    }

    pub async fn approval_decision(
        store: &dyn SessionStore,
        id: &str,
        approval_id: &str,
        after: u64,
    ) -> Result<Option<Decision>, SessionError> {
        let mut from = after;
        loop {
            let page = store.events(id, from, 1000).await?;
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

    pub async fn checkout_commit(
        store: &dyn SessionStore,
        id: &str,
    ) -> Result<Option<String>, SessionError> {
        // It is among the first few events; look at the first page only.
        let page = store.events(id, 0, 100).await?;
        Ok(page.into_iter().find_map(|e| match e.kind {
            EventKind::RepoCheckedOut { commit, .. } => Some(commit),
            _ => None,
        }))
    }
}
