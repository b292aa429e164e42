//! The session log of the control role's broker (docs/sessions.md, "On many
//! hosts"): reads from the shared sessions store, writes posted to the
//! session's owning host (`POST /v1/sessions/{id}/broker-events`, through
//! [`OwnerPost`]), so that every event is written under the owner's epoch.
//!
//! A write's delivery key is derived from what it writes (session and
//! events, or the approval id), so the same write asked again, by a retry
//! here or by the agent asking again after an answer was lost, lands once.
//! The broker already writes each of a call's events once per call (its
//! own record says which are written), so two writes that are the same
//! bytes are the same write.

use super::SessionLog;
use crate::store::BrokerWrite;
use hatchery_sessions::broker_events::{ApprovalRequest, BrokerEvents, BrokerEventsWritten};
use hatchery_sessions::broker_hooks::{reads, Decision, LoggedCall};
use hatchery_sessions::error::SessionError;
use hatchery_sessions::events::EventKind;
use hatchery_sessions::owner_post::{Attempt, OwnerPost};
use hatchery_sessions::store::{Session, SessionStore};
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::time::Duration;

/// How long one write keeps trying to reach the owner: a lost host's
/// sessions are taken over within its lease TTL and a sweep. Past it the
/// agent is told to ask again (503), nothing having been done.
const WRITE_DEADLINE: Duration = Duration::from_secs(60);
const RETRY_EVERY: Duration = Duration::from_millis(250);

/// Why a write to the owner did not land. Each maps onto the
/// [`SessionError`] the broker answers by (503, 404, 409, 500).
#[derive(Debug, thiserror::Error)]
pub enum RemoteLogError {
    #[error("the owner of session {session} is out of reach ({why}); nothing was done, ask again")]
    OutOfReach { session: String, why: String },
    #[error("session {0} has no owner")]
    UnknownSession(String),
    #[error("broker events of session {session} not written ({outcome}: {why})")]
    NotWritten {
        session: String,
        outcome: &'static str,
        why: String,
    },
    #[error("broker events as JSON: {0}")]
    Encode(#[source] serde_json::Error),
    #[error("the owner's answer to broker events: {0}")]
    Answer(#[source] serde_json::Error),
}

impl From<RemoteLogError> for SessionError {
    fn from(e: RemoteLogError) -> Self {
        match e {
            RemoteLogError::OutOfReach { .. } => SessionError::StoreUnavailable(e.to_string()),
            RemoteLogError::UnknownSession(id) => SessionError::NotFound(id),
            RemoteLogError::NotWritten { .. } => SessionError::Conflict(e.to_string()),
            RemoteLogError::Encode(_) | RemoteLogError::Answer(_) => {
                SessionError::Internal(e.to_string())
            }
        }
    }
}

pub struct RemoteSessionLog {
    store: Arc<dyn SessionStore>,
    post: OwnerPost,
    deadline: Duration,
    retry_every: Duration,
}

impl RemoteSessionLog {
    /// Reads from `store` (the shared one), writes through `post`.
    pub fn new(store: Arc<dyn SessionStore>, post: OwnerPost) -> Self {
        RemoteSessionLog {
            store,
            post,
            deadline: WRITE_DEADLINE,
            retry_every: RETRY_EVERY,
        }
    }
}

/// The delivery key of a post: `brk_` and 40 hex of its hash.
fn delivery_key(session: &str, body: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(session.as_bytes());
    h.update(b"\n");
    h.update(body);
    let hex: String = h.finalize()[..20]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("brk_{hex}")
}

/// The seqs of events written by an earlier post, from the log: a call's
/// `broker_call` and `broker_result` (the broker keeps those seqs), in
/// order, up to the first it cannot name.
fn logged_seqs(kinds: &[EventKind], logged: Option<&LoggedCall>) -> Vec<u64> {
    let Some(l) = logged else { return vec![] };
    kinds
        .iter()
        .map_while(|k| match k {
            EventKind::BrokerCall { .. } => l.call.as_ref().map(|c| c.0),
            EventKind::BrokerResult { .. } => l.result.as_ref().map(|r| r.0),
            _ => None,
        })
        .collect()
}

fn to_body(post: &BrokerEvents) -> Result<Vec<u8>, RemoteLogError> {
    serde_json::to_vec(post).map_err(RemoteLogError::Encode)
}

fn call_seq(kinds: &[EventKind]) -> Option<u64> {
    kinds.iter().find_map(|k| match k {
        EventKind::BrokerCall { call_seq, .. }
        | EventKind::BrokerEffectStarted { call_seq, .. }
        | EventKind::BrokerResult { call_seq, .. }
        | EventKind::BrokerCallResolved { call_seq, .. } => Some(*call_seq),
        _ => None,
    })
}

impl RemoteSessionLog {
    /// Posts events (and the broker's rows that commit with them) to the
    /// owner; `None` when the rows declined and nothing was written.
    async fn post_events(
        &self,
        id: &str,
        kinds: Vec<EventKind>,
        joined: Option<serde_json::Value>,
    ) -> Result<Option<Vec<u64>>, SessionError> {
        let post = BrokerEvents {
            events: kinds,
            approval: None,
            joined,
        };
        let body = to_body(&post)?;
        let key = delivery_key(id, &body);
        let written = self.write(id, &body, &key).await?;
        if written.declined {
            return Ok(None);
        }
        if !written.repeat {
            return Ok(Some(written.seqs));
        }
        // Written before (an answer lost on the way), rows and all: the
        // seqs the broker keeps are in the log.
        let logged = match call_seq(&post.events) {
            Some(seq) => reads::logged_broker_call(&*self.store, id, seq).await?,
            None => None,
        };
        Ok(Some(logged_seqs(&post.events, logged.as_ref())))
    }

    /// Posts until the owner has it, refuses it, or the deadline passes.
    async fn write(
        &self,
        session: &str,
        body: &[u8],
        key: &str,
    ) -> Result<BrokerEventsWritten, RemoteLogError> {
        let deadline = tokio::time::Instant::now() + self.deadline;
        loop {
            match self.post.attempt(session, "broker-events", key, body).await {
                Attempt::Delivered(answer) => {
                    return serde_json::from_slice(&answer).map_err(RemoteLogError::Answer)
                }
                Attempt::Retry(why) if tokio::time::Instant::now() < deadline => {
                    tracing::debug!(session, why, "broker events: owner not reachable yet");
                    tokio::time::sleep(self.retry_every).await;
                }
                Attempt::Retry(why) => {
                    return Err(RemoteLogError::OutOfReach {
                        session: session.into(),
                        why,
                    })
                }
                Attempt::Dropped("unknown_session", _) => {
                    return Err(RemoteLogError::UnknownSession(session.into()))
                }
                Attempt::Dropped(outcome, why) => {
                    return Err(RemoteLogError::NotWritten {
                        session: session.into(),
                        outcome,
                        why,
                    })
                }
            }
        }
    }
}

#[async_trait::async_trait]
impl SessionLog for RemoteSessionLog {
    async fn session_for_sandbox(&self, sandbox_id: &str) -> Result<Option<Session>, SessionError> {
        reads::session_for_sandbox(&*self.store, sandbox_id).await
    }

    /// One commit, the owner's: the broker's rows travel with the events
    /// and the owner writes both in one transaction on the shared
    /// database, under its epoch (and tells its live streams and runner).
    /// The write's outcome stays there: the broker reads its row back
    /// (the same database) rather than trusting an answer that may be lost.
    async fn record_joined(
        &self,
        id: &str,
        kinds: Vec<EventKind>,
        joined: &mut BrokerWrite,
    ) -> Result<Option<Vec<u64>>, SessionError> {
        let write = serde_json::to_value(&*joined).map_err(RemoteLogError::Encode)?;
        self.post_events(id, kinds, Some(write)).await
    }

    async fn record(&self, id: &str, kinds: Vec<EventKind>) -> Result<Vec<u64>, SessionError> {
        Ok(self.post_events(id, kinds, None).await?.unwrap_or_default())
    }

    async fn open_approval(
        &self,
        id: &str,
        approval_id: &str,
        action: &str,
        details: &str,
    ) -> Result<(), SessionError> {
        let post = BrokerEvents {
            events: vec![],
            joined: None,
            approval: Some(ApprovalRequest {
                approval_id: approval_id.into(),
                action: action.into(),
                details: details.into(),
            }),
        };
        // Opening an approval is idempotent on the owner; its id is the key.
        self.write(id, &to_body(&post)?, approval_id).await?;
        Ok(())
    }

    async fn approval_decision(
        &self,
        id: &str,
        approval_id: &str,
        after: u64,
    ) -> Result<Option<Decision>, SessionError> {
        reads::approval_decision(&*self.store, id, approval_id, after).await
    }

    async fn checkout_commit(&self, id: &str) -> Result<Option<String>, SessionError> {
        reads::checkout_commit(&*self.store, id).await
    }

    /// The control role's broker is the only one (hosts relay to it):
    /// every call in its record is its own.
    async fn owned_elsewhere(&self, _id: &str) -> Result<bool, SessionError> {
        Ok(false)
    }
}

#[cfg(test)]
#[path = "remote_tests.rs"]
pub(crate) mod tests;
