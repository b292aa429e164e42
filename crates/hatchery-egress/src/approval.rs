//! Egress that waits for a person (docs/sessions.md, "Egress approvals"):
//! a connection a `require_approval` rule decides is held, before anything
//! is dialled, while an [`Approver`] asks and waits for a decision. The
//! proxy only holds the connection and acts on the answer; asking,
//! recording and remembering are the approver's (sessions implement it
//! over the session's log and its decision endpoint).

use crate::events::{SessionId, SourceError};
use std::time::Duration;

/// One held connection's question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalAsk {
    pub session: SessionId,
    /// The destination as the guest named it (normalised) and its port.
    pub host: String,
    pub port: u16,
    /// The request's method and path, when the proxy has them before it
    /// dials: a forwarded plain-HTTP request. A CONNECT is asked for
    /// before anything reaches the destination, so by host and port only.
    pub method: Option<String>,
    pub path: Option<String>,
    /// The `require_approval` rule that decided, and the policy version.
    pub rule_id: String,
    pub policy_version: Option<u32>,
    /// The rule's hold limit: the approver answers [`Answer::TimedOut`]
    /// once it has passed without a decision.
    pub timeout: Duration,
}

/// What became of a question. Each one is in the session's log before
/// the approver returns it, so the connection goes on (or not) only after
/// its record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// A person approved (`approval_id`), or an earlier approval with
    /// `remember: "session"` covers this destination (`remembered`).
    Approved {
        approval_id: String,
        remembered: bool,
    },
    Denied {
        approval_id: String,
        note: String,
    },
    /// No decision within the rule's hold limit.
    TimedOut {
        approval_id: String,
    },
}

/// Asks for a decision on a held connection and waits for it (at most
/// the ask's timeout, plus the time to record the timeout). An error
/// refuses the connection (503).
#[async_trait::async_trait]
pub trait Approver: Send + Sync + 'static {
    async fn ask(&self, ask: ApprovalAsk) -> Result<Answer, SourceError>;
}
