//! What the tool broker (`crates/hatchery-broker`) plugs into sessions and
//! reads of them: its record of a session's calls ([`BrokerUsage`]), the
//! reader of the writes a remote broker or gateway posts with its events
//! ([`RemoteJoined`]), an approval's [`Decision`], and its reads of the
//! shared log ([`reads`]). What it may do through [`Sessions`] is in
//! broker_access.rs: the service holds these plug-ins, so they stay below
//! it.
//!
//! [`Sessions`]: crate::Sessions

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
    /// The write, for a call of `session`; an error says why it is refused
    /// (the product's own error type; its text is the 400's message).
    fn decode(
        &self,
        session: &str,
        write: serde_json::Value,
    ) -> Result<Box<dyn hatchery_db::Joined>, JoinedRefused>;
}

/// Why a product refuses a posted write, as the product's error.
pub type JoinedRefused = Box<dyn std::error::Error + Send + Sync>;

/// How an approval was decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub approved: bool,
    pub note: String,
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
                    ..
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
