//! The session's pinned policy, asked about a model call before it is
//! reserved or reaches the upstream (issue 36): the tool `model_call`
//! with the call's estimated cost in cents (what the reservation covers,
//! so `cost` rules bound what one call may spend). The daemon implements
//! [`CallPolicy`] over its sessions and policies, and holds a call its
//! rule says `require_approval` for until a person decides (the rule's
//! `approval_timeout_s` bounds the hold) before it answers; a gateway
//! without one (the standalone binary) decides on budgets alone.

use crate::budget::{Amount, Caller};
use async_trait::async_trait;

/// What the pinned policy says about one model call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    /// Refused: 403 `policy_denied`, naming the rule.
    Deny {
        rule: Option<String>,
    },
    /// A person's approval is needed and this policy cannot hold the call
    /// for one (the control role's gateway, which has no sessions of its
    /// own): refused, 403 `approval_required`, naming the rule. A held
    /// call that a person approved is [`Verdict::Allow`]; one they denied
    /// is [`Verdict::Deny`].
    RequireApproval {
        rule: Option<String>,
    },
    /// The call was held for a person's approval and none came within the
    /// rule's hold limit: refused, 403 `approval_timeout`.
    ApprovalTimedOut {
        rule: Option<String>,
        approval_id: String,
    },
    /// The session already has as many approvals open as it may: the call
    /// is not held, 503 `too_many_approvals`.
    TooManyApprovals {
        open: u64,
    },
    /// The session the sandbox is bound to no longer exists (deleted while
    /// a binding outlived it): refused as an ended session's call is, 409
    /// `session_ended`, not an internal error.
    SessionGone,
}

#[derive(Debug, thiserror::Error)]
#[error("evaluating the session's policy for a model call")]
pub struct PolicyCheckError(#[source] pub Box<dyn std::error::Error + Send + Sync>);

#[async_trait]
pub trait CallPolicy: Send + Sync {
    async fn model_call(
        &self,
        caller: &Caller,
        model: &str,
        estimate: Amount,
    ) -> Result<Verdict, PolicyCheckError>;
}
