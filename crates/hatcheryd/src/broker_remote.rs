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

use hatchery_broker::session_log::SessionLog;
use hatchery_broker::store::BrokerWrite;
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

pub struct RemoteSessionLog {
    pub store: Arc<dyn SessionStore>,
    pub post: OwnerPost,
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

fn to_body(post: &BrokerEvents) -> Result<Vec<u8>, SessionError> {
    serde_json::to_vec(post).map_err(|e| SessionError::Internal(e.to_string()))
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
    ) -> Result<BrokerEventsWritten, SessionError> {
        let deadline = tokio::time::Instant::now() + WRITE_DEADLINE;
        loop {
            match self.post.attempt(session, "broker-events", key, body).await {
                Attempt::Delivered(answer) => {
                    return serde_json::from_slice(&answer).map_err(|e| {
                        SessionError::Internal(format!("the owner's answer to broker events: {e}"))
                    })
                }
                Attempt::Retry(why) if tokio::time::Instant::now() < deadline => {
                    tracing::debug!(session, why, "broker events: owner not reachable yet");
                    tokio::time::sleep(RETRY_EVERY).await;
                }
                Attempt::Retry(why) => {
                    return Err(SessionError::StoreUnavailable(format!(
                        "the owner of session {session} is out of reach ({why}); nothing was done, ask again"
                    )))
                }
                Attempt::Dropped("unknown_session", _) => {
                    return Err(SessionError::NotFound(session.to_string()))
                }
                Attempt::Dropped(outcome, why) => {
                    return Err(SessionError::Conflict(format!(
                        "broker events of session {session} not written ({outcome}: {why})"
                    )))
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
        let write = serde_json::to_value(&*joined)
            .map_err(|e| SessionError::Internal(format!("a broker write as JSON: {e}")))?;
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
        self.write(id, &to_body(&post)?, approval_id)
            .await
            .map(|_| ())
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
mod tests {
    use super::*;

    fn call(seq: u64) -> EventKind {
        EventKind::BrokerCall {
            call_seq: seq,
            epoch: 1,
            tool: "noop".into(),
            arguments: "{}".into(),
            decision: "allow".into(),
            rule_id: None,
            approval_id: None,
        }
    }

    fn result(seq: u64) -> EventKind {
        EventKind::BrokerResult {
            call_seq: seq,
            tool: "noop".into(),
            status: "done".into(),
            output: "{}".into(),
        }
    }

    #[test]
    fn the_same_write_has_the_same_key_and_another_another() {
        let k = delivery_key("ses_a", b"{\"events\":[1]}");
        assert_eq!(k, delivery_key("ses_a", b"{\"events\":[1]}"));
        assert_ne!(k, delivery_key("ses_b", b"{\"events\":[1]}"));
        assert_ne!(k, delivery_key("ses_a", b"{\"events\":[2]}"));
        // What the owner's route takes: 1 to 64 of A-Z a-z 0-9 - _.
        assert_eq!(k.len(), 44);
        assert!(k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'));
    }

    #[test]
    fn a_repeated_write_finds_its_seqs_in_the_log() {
        let logged = LoggedCall {
            call: Some((7, "noop".into(), "{}".into(), "allow".into())),
            effect: None,
            result: Some((9, "done".into(), "{}".into())),
        };
        assert_eq!(
            logged_seqs(&[call(3), result(3)], Some(&logged)),
            vec![7, 9]
        );
        assert_eq!(logged_seqs(&[result(3)], Some(&logged)), vec![9]);
        let started = EventKind::BrokerEffectStarted {
            call_seq: 3,
            tool: "noop".into(),
            detail: "x".into(),
        };
        // Up to the first it cannot name.
        assert_eq!(
            logged_seqs(&[call(3), started.clone()], Some(&logged)),
            vec![7]
        );
        assert_eq!(
            logged_seqs(&[started, call(3)], Some(&logged)),
            Vec::<u64>::new()
        );
        assert_eq!(logged_seqs(&[call(3)], None), Vec::<u64>::new());
        assert_eq!(call_seq(&[result(4)]), Some(4));
    }
}
