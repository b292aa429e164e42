//! The egress proxy's [`Approver`] for session sandboxes (docs/sessions.md,
//! "Egress approvals"). A held connection becomes a pending approval of
//! action `egress` (details: host, port, method and path when known, the
//! rule, the hold limit) and the session moves to `waiting_approval`; a
//! person decides it through the usual decision endpoint; this waits for
//! the `approval_decided` event in the session's log. Out of time, it
//! decides `timeout` itself (actor `system`) and only then answers, so
//! every answer is in the log before the proxy acts on it.
//!
//! Bounds, since a hostile guest can open held connections at will:
//! connections of a session to one destination held at the same time share
//! one question (and its answer), and a session with its
//! `--sessions-max-open-approvals` open gets no new one (503).
//!
//! `remember: "session"` on a decision makes it hold for the session's
//! later connections to that host and port, or, for a request held on an
//! intercepted connection (details `scope: "request"`), for its later
//! requests with the same method and exact path (query aside) to that
//! host and port ([`DecisionKey`]). Remembered decisions are read
//! back from the log the first time a session asks after this daemon
//! started (or took the session over, or the session resumed), then kept
//! in memory until its sandbox is let go ([`SessionApprovals::forget`]).

use crate::error::SessionError;
use crate::events::EventKind;
use crate::store::{Decided, StoreError};
use crate::Sessions;
use hatchery_egress::{Answer, ApprovalAsk, Approver, DecisionKey, SourceError};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// The `action` of an egress approval.
pub const ACTION: &str = "egress";
/// Egress approval ids start with this; an agent's (`apr_` and 16
/// characters of `[a-z0-9]`) never do, so its decisions are not handed to
/// the agent.
pub const ID_PREFIX: &str = "apr_egress_";
/// How often a held connection looks for its decision.
const POLL: Duration = Duration::from_millis(200);

#[derive(Debug, thiserror::Error)]
pub enum ApprovalError {
    #[error("the session log")]
    Log(#[from] SessionError),
    #[error("the session log")]
    Store(#[from] StoreError),
    #[error("the session has {0} approvals open, its cap (--sessions-max-open-approvals)")]
    TooMany(u64),
    /// The question another held connection asked failed; this one shares
    /// its fate.
    #[error("{0}")]
    Shared(String),
}

/// A question in flight: the session and what its decision covers.
type Key = (String, DecisionKey);
type Shared = watch::Receiver<Option<Result<Answer, String>>>;

#[derive(Clone)]
struct Remembered {
    approval_id: String,
    approved: bool,
}

#[derive(Default)]
struct State {
    /// Per session (present once read back from the log).
    remembered: HashMap<String, HashMap<DecisionKey, Remembered>>,
    in_flight: HashMap<Key, Shared>,
}

pub struct SessionApprovals {
    sessions: Arc<Sessions>,
    state: Mutex<State>,
}

impl SessionApprovals {
    pub fn new(sessions: Arc<Sessions>) -> Arc<Self> {
        Arc::new(SessionApprovals {
            sessions,
            state: Mutex::default(),
        })
    }

    /// Drops what is kept in memory of a session whose sandbox was let go
    /// (it ended, went idle or moved): its remembered decisions are read
    /// back from the log if it asks again.
    pub fn forget(&self, session: &str) {
        self.lock().remembered.remove(session);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The session's remembered decision on `dest`.
    async fn remembered(
        &self,
        session: &str,
        dest: &DecisionKey,
    ) -> Result<Option<Remembered>, ApprovalError> {
        if let Some(m) = self.lock().remembered.get(session) {
            return Ok(m.get(dest).cloned());
        }
        let found = read_remembered(&self.sessions, session).await?;
        let r = found.get(dest).cloned();
        self.lock()
            .remembered
            .entry(session.to_string())
            .or_insert(found);
        Ok(r)
    }

    /// Asks once, waits, and answers (recorded in the log first).
    async fn ask_and_wait(&self, a: &ApprovalAsk) -> Result<Answer, ApprovalError> {
        let core = &self.sessions.core;
        let open = core.store.usage(&a.session).await?.open_approvals;
        if open >= core.cfg.max_open_approvals {
            return Err(ApprovalError::TooMany(open));
        }
        let approval_id = crate::ids::new_id("apr_egress");
        let details = serde_json::json!({
            "host": a.host, "port": a.port, "method": a.method, "path": a.path,
            "scope": if a.per_request { "request" } else { "connection" },
            "rule_id": a.rule_id, "policy_version": a.policy_version,
            "timeout_s": a.timeout.as_secs(),
        });
        let after = core.store.get(&a.session).await?.last_seq;
        self.sessions
            .open_approval(&a.session, &approval_id, ACTION, &details.to_string())
            .await?;
        let deadline = tokio::time::Instant::now() + a.timeout;
        loop {
            if let Some(d) = decision(&self.sessions, &a.session, &approval_id, after).await? {
                return Ok(self.answer(a, approval_id, d));
            }
            if tokio::time::Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep_until(deadline.min(tokio::time::Instant::now() + POLL)).await;
        }
        let note = format!(
            "no decision within {} s (rule {:?})",
            a.timeout.as_secs(),
            a.rule_id
        );
        let timed_out = Decided {
            decision: "timeout",
            note: &note,
            remember: None,
            actor: crate::events::Actor::System,
        };
        match core
            .store
            .decide_approval(&a.session, &approval_id, timed_out)
            .await
        {
            Ok(evs) => {
                core.bus.publish(&a.session, &evs);
                self.sessions.nudge(&a.session);
                Ok(Answer::TimedOut { approval_id })
            }
            // A person decided in the meantime: that decision stands.
            Err(StoreError::ApprovalNotFound(_)) => {
                match decision(&self.sessions, &a.session, &approval_id, after).await? {
                    Some(d) => Ok(self.answer(a, approval_id, d)),
                    None => Err(StoreError::ApprovalNotFound(approval_id).into()),
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The answer to a decision, remembering it when it says so.
    fn answer(&self, a: &ApprovalAsk, approval_id: String, d: Found) -> Answer {
        if d.remember {
            self.lock()
                .remembered
                .entry(a.session.clone())
                .or_default()
                .insert(
                    a.key(),
                    Remembered {
                        approval_id: approval_id.clone(),
                        approved: d.approved,
                    },
                );
        }
        if d.approved {
            Answer::Approved {
                approval_id,
                remembered: false,
            }
        } else {
            Answer::Denied {
                approval_id,
                note: d.note,
            }
        }
    }
}

#[async_trait::async_trait]
impl Approver for SessionApprovals {
    async fn ask(&self, a: ApprovalAsk) -> Result<Answer, SourceError> {
        let dest = a.key();
        if let Some(r) = self.remembered(&a.session, &dest).await? {
            return Ok(if r.approved {
                Answer::Approved {
                    approval_id: r.approval_id,
                    remembered: true,
                }
            } else {
                Answer::Denied {
                    approval_id: r.approval_id,
                    note: "remembered for the session".into(),
                }
            });
        }
        let key: Key = (a.session.clone(), dest);
        let joined = {
            let mut st = self.lock();
            match st.in_flight.get(&key) {
                Some(rx) => Err(rx.clone()),
                None => {
                    let (tx, rx) = watch::channel(None);
                    st.in_flight.insert(key.clone(), rx);
                    Ok(tx)
                }
            }
        };
        let tx = match joined {
            Ok(tx) => tx,
            Err(mut rx) => {
                // Another connection to this destination asked: its answer
                // is this one's too.
                let got = rx.wait_for(Option::is_some).await.map(|v| v.clone());
                return match got {
                    Ok(Some(Ok(answer))) => Ok(answer),
                    Ok(Some(Err(why))) => Err(Box::new(ApprovalError::Shared(why))),
                    _ => Err(Box::new(ApprovalError::Shared(
                        "the question was dropped".into(),
                    ))),
                };
            }
        };
        let out = self.ask_and_wait(&a).await;
        self.lock().in_flight.remove(&key);
        let _ = tx.send(Some(match &out {
            Ok(answer) => Ok(answer.clone()),
            Err(e) => Err(hatchery_serve::error_text::with_causes(e)),
        }));
        Ok(out?)
    }
}

/// The agent exited: the egress approvals still pending (a held
/// connection of a process that outlived it, or one whose waiter is gone)
/// are denied by the system, so the session can end (`waiting_approval`
/// cannot). A held connection still waiting gets its 403 from the denial.
pub(crate) async fn close_for_exit(
    svc: &Arc<crate::session_core::SessionCore>,
    id: &str,
) -> Result<(), StoreError> {
    // Bounded: each round decides one; at most the open-approvals cap.
    for _ in 0..=svc.cfg.max_open_approvals {
        let Some(a) = svc.store.pending_approval(id).await? else {
            return Ok(());
        };
        if a.action != ACTION || !a.approval_id.starts_with(ID_PREFIX) {
            return Ok(());
        }
        let closed = Decided {
            decision: "deny",
            note: "the session's agent exited",
            remember: None,
            actor: crate::events::Actor::System,
        };
        match svc.store.decide_approval(id, &a.approval_id, closed).await {
            Ok(evs) => svc.bus.publish(id, &evs),
            Err(StoreError::ApprovalNotFound(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

struct Found {
    approved: bool,
    note: String,
    remember: bool,
}

/// The decision on `approval_id` in the log after `after`, if any.
async fn decision(
    sessions: &Sessions,
    session: &str,
    approval_id: &str,
    after: u64,
) -> Result<Option<Found>, StoreError> {
    let mut from = after;
    loop {
        let page = sessions.core.store.events(session, from, 1000).await?;
        let Some(last) = page.last() else {
            return Ok(None);
        };
        from = last.seq;
        for e in page {
            if let EventKind::ApprovalDecided {
                approval_id: id,
                decision,
                note,
                remember,
            } = e.kind
            {
                if id == approval_id {
                    return Ok(Some(Found {
                        approved: decision == "approve",
                        note,
                        remember: remember.as_deref() == Some("session"),
                    }));
                }
            }
        }
    }
}

/// What an `egress` approval's details say its decision covers: host and
/// port, and method and path when it was asked per request (`scope:
/// "request"`; details written before the scope existed are connection
/// ones).
fn key_of(v: &serde_json::Value) -> Option<DecisionKey> {
    let host = v["host"].as_str()?;
    let port = u16::try_from(v["port"].as_u64()?).ok()?;
    let request = match v["scope"].as_str() {
        Some("request") => Some((v["method"].as_str()?, v["path"].as_str()?)),
        _ => None,
    };
    Some(DecisionKey::new(host, port, request))
}

/// The session's remembered egress decisions, from its whole log (the
/// latest per destination wins).
async fn read_remembered(
    sessions: &Sessions,
    session: &str,
) -> Result<HashMap<DecisionKey, Remembered>, StoreError> {
    let mut asked: HashMap<String, DecisionKey> = HashMap::new();
    let mut out = HashMap::new();
    let mut from = 0;
    loop {
        let page = sessions.core.store.events(session, from, 1000).await?;
        let Some(last) = page.last() else {
            return Ok(out);
        };
        from = last.seq;
        for e in page {
            match e.kind {
                EventKind::ApprovalRequested {
                    approval_id,
                    action,
                    details,
                } if action == ACTION => {
                    let v: serde_json::Value = serde_json::from_str(&details).unwrap_or_default();
                    if let Some(k) = key_of(&v) {
                        asked.insert(approval_id, k);
                    }
                }
                EventKind::ApprovalDecided {
                    approval_id,
                    decision,
                    remember: Some(r),
                    ..
                } if r == "session" => {
                    if let Some(dest) = asked.get(&approval_id) {
                        out.insert(
                            dest.clone(),
                            Remembered {
                                approved: decision == "approve",
                                approval_id,
                            },
                        );
                    }
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn details_read_back_into_the_key_they_were_asked_with() {
        let req = json!({"host": "h", "port": 443, "method": "GET", "path": "/a",
                         "scope": "request"});
        assert_eq!(
            key_of(&req),
            Some(DecisionKey::new("h", 443, Some(("GET", "/a"))))
        );
        // A connection's, and one written before `scope` existed: host
        // and port only, even with a plain request's method and path.
        for v in [
            json!({"host": "h", "port": 443, "method": null, "path": null, "scope": "connection"}),
            json!({"host": "h", "port": 443, "method": "GET", "path": "/a"}),
        ] {
            assert_eq!(key_of(&v), Some(DecisionKey::new("h", 443, None)), "{v}");
        }
        // Unreadable: no key (never a wider one).
        for v in [
            json!({"host": "h", "port": 70000}),
            json!({"port": 443}),
            json!({"host": "h", "port": 443, "scope": "request", "method": "GET"}),
        ] {
            assert_eq!(key_of(&v), None, "{v}");
        }
    }
}
