//! Questions the host holds something for while a person decides
//! (docs/sessions.md, "Egress approvals" and "Model call approvals"): an
//! egress connection or request ([`Approver`], for the egress proxy) and a
//! model call the session's pinned policy says `require_approval` for
//! ([`SessionApprovals::model_call`], for the model gateway). A held
//! question becomes a pending approval of action `egress` (details: host,
//! port, method and path when known, the rule, the hold limit) or
//! `model_call` (the model, the call's estimated tokens and cents, the
//! rule, the hold limit), and the session moves to `waiting_approval`; a
//! person decides it through the usual decision endpoint; this waits for
//! the `approval_decided` event in the session's log. Out of time, it
//! decides `timeout` itself (actor `system`) and only then answers, so
//! every answer is in the log before the proxy or the gateway acts on it.
//!
//! Bounds, since a hostile guest can open held connections and make
//! model calls at will: connections of a session to one destination held
//! at the same time share one question (and its answer), and a session
//! with its `--sessions-max-open-approvals` open gets no new one (503).
//! Model calls held at once each ask their own question (each names its
//! own model and cost), under the same cap.
//!
//! `remember: "session"` on a decision makes it hold for the session's
//! later connections to that host and port, or, for a request held on an
//! intercepted connection (details `scope: "request"`), for its later
//! requests with the same method and exact path (query aside) to that
//! host and port ([`DecisionKey`]); on a model call's, for the session's
//! later model calls the same rule decides. Remembered decisions are read
//! back from the log the first time a session asks after this daemon
//! started (or took the session over, or the session resumed), then kept
//! in memory until its sandbox is let go ([`SessionApprovals::forget`]).

use crate::error::SessionError;
use crate::events::EventKind;
use crate::store::{Decided, StoreError};
use crate::Sessions;
/// A held question's answer, the proxy's and the gateway's alike.
pub use hatchery_egress::Answer;
use hatchery_egress::{ApprovalAsk, Approver, DecisionKey, SourceError};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// The `action` of an egress approval.
pub const ACTION: &str = "egress";
/// The `action` of a held model call's approval.
pub const MODEL_CALL_ACTION: &str = "model_call";
/// Egress approval ids start with this, a held model call's with
/// [`MODEL_CALL_ID_PREFIX`]; an agent's (`apr_` and 16 characters of
/// `[a-z0-9]`) never do, so their decisions are not handed to the agent.
pub const ID_PREFIX: &str = "apr_egress_";
pub const MODEL_CALL_ID_PREFIX: &str = "apr_model_";

/// Whether `approval_id` names a question the host holds something for
/// (not one the agent asked).
pub fn is_held(approval_id: &str) -> bool {
    approval_id.starts_with(ID_PREFIX) || approval_id.starts_with(MODEL_CALL_ID_PREFIX)
}
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

/// What a remembered decision covers within its session.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum HoldKey {
    Egress(DecisionKey),
    /// Model calls the rule with this id decides.
    ModelCall(String),
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
    remembered: HashMap<String, HashMap<HoldKey, Remembered>>,
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
        dest: &HoldKey,
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
    async fn ask_and_wait(&self, q: Question<'_>) -> Result<Answer, ApprovalError> {
        let core = &self.sessions.core;
        let open = core.store.usage(q.session).await?.open_approvals;
        if open >= core.cfg.max_open_approvals {
            return Err(ApprovalError::TooMany(open));
        }
        let approval_id = crate::ids::new_id(q.id_kind);
        let after = core.store.get(q.session).await?.last_seq;
        self.sessions
            .open_approval(q.session, &approval_id, q.action, &q.details.to_string())
            .await?;
        let deadline = tokio::time::Instant::now() + q.timeout;
        loop {
            if let Some(d) = decision(&self.sessions, q.session, &approval_id, after).await? {
                return Ok(self.answer(q.session, q.key, approval_id, d));
            }
            if tokio::time::Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep_until(deadline.min(tokio::time::Instant::now() + POLL)).await;
        }
        let note = format!(
            "no decision within {} s (rule {:?})",
            q.timeout.as_secs(),
            q.rule_id
        );
        let timed_out = Decided {
            decision: "timeout",
            note: &note,
            remember: None,
            actor: crate::events::Actor::System,
        };
        match core
            .store
            .decide_approval(q.session, &approval_id, timed_out)
            .await
        {
            Ok(evs) => {
                core.bus.publish(q.session, &evs);
                self.sessions.nudge(q.session);
                Ok(Answer::TimedOut { approval_id })
            }
            // A person decided in the meantime: that decision stands.
            Err(StoreError::ApprovalNotFound(_)) => {
                match decision(&self.sessions, q.session, &approval_id, after).await? {
                    Some(d) => Ok(self.answer(q.session, q.key, approval_id, d)),
                    None => Err(StoreError::ApprovalNotFound(approval_id).into()),
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The answer to a decision, remembering it when it says so.
    fn answer(&self, session: &str, key: HoldKey, approval_id: String, d: Found) -> Answer {
        if d.remember {
            self.lock()
                .remembered
                .entry(session.to_string())
                .or_default()
                .insert(
                    key,
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

    /// Holds a model call the session's pinned policy says
    /// `require_approval` for until a person decides, the rule's hold
    /// limit passes (a `timeout` decision) or a remembered decision on the
    /// same rule answers at once.
    pub async fn model_call(&self, a: &ModelCallAsk) -> Result<Answer, ApprovalError> {
        let key = HoldKey::ModelCall(a.rule_id.clone());
        if let Some(r) = self.remembered(&a.session, &key).await? {
            return Ok(r.answer());
        }
        let details = serde_json::json!({
            "model": a.model, "tokens": a.tokens, "usd_cents": a.usd_cents,
            "rule_id": a.rule_id, "policy_version": a.policy_version,
            "timeout_s": a.timeout.as_secs(),
        });
        self.ask_and_wait(Question {
            session: &a.session,
            action: MODEL_CALL_ACTION,
            id_kind: "apr_model",
            details,
            timeout: a.timeout,
            rule_id: &a.rule_id,
            key,
        })
        .await
    }
}

/// A model call held for a person: what its pending approval shows.
#[derive(Debug, Clone)]
pub struct ModelCallAsk {
    pub session: String,
    pub model: String,
    /// The call's estimate (what its reservation would be).
    pub tokens: u64,
    pub usd_cents: u64,
    pub rule_id: String,
    pub policy_version: u32,
    pub timeout: Duration,
}

/// One question, whatever is held for it.
struct Question<'a> {
    session: &'a str,
    action: &'static str,
    /// The approval id's prefix, before `_` and the random part.
    id_kind: &'static str,
    details: serde_json::Value,
    timeout: Duration,
    rule_id: &'a str,
    key: HoldKey,
}

impl Remembered {
    fn answer(self) -> Answer {
        if self.approved {
            Answer::Approved {
                approval_id: self.approval_id,
                remembered: true,
            }
        } else {
            Answer::Denied {
                approval_id: self.approval_id,
                note: "remembered for the session".into(),
            }
        }
    }
}

#[async_trait::async_trait]
impl Approver for SessionApprovals {
    async fn ask(&self, a: ApprovalAsk) -> Result<Answer, SourceError> {
        let dest = a.key();
        if let Some(r) = self
            .remembered(&a.session, &HoldKey::Egress(dest.clone()))
            .await?
        {
            return Ok(r.answer());
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
        let details = serde_json::json!({
            "host": a.host, "port": a.port, "method": a.method, "path": a.path,
            "scope": if a.per_request { "request" } else { "connection" },
            "rule_id": a.rule_id, "policy_version": a.policy_version,
            "timeout_s": a.timeout.as_secs(),
        });
        let out = self
            .ask_and_wait(Question {
                session: &a.session,
                action: ACTION,
                id_kind: "apr_egress",
                details,
                timeout: a.timeout,
                rule_id: &a.rule_id,
                key: HoldKey::Egress(key.1.clone()),
            })
            .await;
        self.lock().in_flight.remove(&key);
        let _ = tx.send(Some(match &out {
            Ok(answer) => Ok(answer.clone()),
            Err(e) => Err(hatchery_serve::error_text::with_causes(e)),
        }));
        Ok(out?)
    }
}

/// The agent exited: the held approvals still pending (a held connection
/// or model call of a process that outlived it, or one whose waiter is
/// gone) are denied by the system, so the session can end
/// (`waiting_approval` cannot). A held connection or call still waiting
/// gets its 403 from the denial.
pub(crate) async fn close_for_exit(
    svc: &Arc<crate::session_core::SessionCore>,
    id: &str,
) -> Result<(), StoreError> {
    // Bounded: each round decides one; at most the open-approvals cap.
    for _ in 0..=svc.cfg.max_open_approvals {
        let Some(a) = svc.store.pending_approval(id).await? else {
            return Ok(());
        };
        if !matches!(a.action.as_str(), ACTION | MODEL_CALL_ACTION) || !is_held(&a.approval_id) {
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

/// What a held approval's details say its decision covers.
fn hold_key_of(action: &str, v: &serde_json::Value) -> Option<HoldKey> {
    match action {
        ACTION => key_of(v).map(HoldKey::Egress),
        MODEL_CALL_ACTION => Some(HoldKey::ModelCall(v["rule_id"].as_str()?.to_string())),
        _ => None,
    }
}

/// The session's remembered held decisions, from its whole log (the
/// latest per destination or rule wins).
async fn read_remembered(
    sessions: &Sessions,
    session: &str,
) -> Result<HashMap<HoldKey, Remembered>, StoreError> {
    let mut asked: HashMap<String, HoldKey> = HashMap::new();
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
                    // Only the host's own questions: an agent may ask
                    // with any action and details.
                } if is_held(&approval_id) => {
                    let v: serde_json::Value = serde_json::from_str(&details).unwrap_or_default();
                    if let Some(k) = hold_key_of(&action, &v) {
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
