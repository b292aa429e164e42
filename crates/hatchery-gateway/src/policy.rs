//! The session's pinned policy, asked about a model call before it is
//! reserved or reaches the upstream (issue 36): the tool `model_call`
//! with the call's estimated cost in cents (what the reservation covers,
//! so `cost` rules bound what one call may spend). The daemon implements
//! [`CallPolicy`] over its sessions and policies; a gateway without one
//! (the standalone binary) decides on budgets alone.

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
    /// A model call cannot wait for a person mid-request: refused, 403
    /// `approval_required`, naming the rule.
    RequireApproval {
        rule: Option<String>,
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
