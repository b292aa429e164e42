//! Why a model call was refused, answered in the caller's protocol: the
//! OpenAI shape `{"error": {"message", "type", "code"}}` or the Anthropic
//! shape `{"type": "error", "error": {"type", "message"}}`.

use crate::budget::BudgetError;
use crate::estimate::EstimateError;
use crate::events::IntentError;
use crate::pricing::PricingError;
use crate::upstream::UpstreamError;
use crate::usage::Flavor;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("missing or unknown gateway key")]
    Unauthorized,
    #[error("this sandbox is not bound to a session")]
    UnboundSandbox,
    #[error("{0}")]
    BadRequest(String),
    #[error("max tokens {asked} is over the gateway's cap of {cap}")]
    OverCap { asked: u64, cap: u64 },
    #[error("the request body is larger than {0} bytes")]
    TooLarge(usize),
    #[error(transparent)]
    Pricing(#[from] PricingError),
    #[error(transparent)]
    Store(BudgetError),
    #[error("no upstream is configured for this API")]
    NoUpstream,
    #[error(transparent)]
    Upstream(UpstreamError),
    #[error("the upstream's answer was too large or broken")]
    BadUpstreamAnswer,
    /// The upstream's answer did not end within the call's deadline
    /// (`settle::answer_deadline`); the whole reservation was charged.
    #[error("the upstream did not finish its answer within {0:?}")]
    AnswerDeadline(std::time::Duration),
    /// The request's input has no upper bound to reserve.
    #[error(transparent)]
    Unbounded(#[from] EstimateError),
    /// A host's relay could not reach the control role's gateway.
    #[error("the model gateway is not reachable: {0}")]
    GatewayUnreachable(String),
    /// The session's policy denies this model call.
    #[error("the session's policy denies this model call (rule {})", .0.as_deref().unwrap_or("default deny"))]
    PolicyDenied(Option<String>),
    /// The session's policy wants a person to approve this model call,
    /// and this gateway cannot hold it for one (crate::policy::Verdict).
    #[error("the session's policy requires approval for this model call (rule {})", .0.as_deref().unwrap_or("-"))]
    ApprovalRequired(Option<String>),
    /// The call was held for a person's approval; none came in time.
    #[error("no decision on approval {approval_id} within its rule's hold limit (rule {})", .rule.as_deref().unwrap_or("-"))]
    ApprovalTimedOut {
        rule: Option<String>,
        approval_id: String,
    },
    /// The session has its cap of open approvals: the call is not held.
    #[error("the session has {0} approvals open, its cap (--sessions-max-open-approvals)")]
    TooManyApprovals(u64),
    /// The policy could not be evaluated: the call is not made.
    #[error(transparent)]
    Policy(crate::policy::PolicyCheckError),
    /// The call's intent could not be written to the session's log: it is
    /// not made.
    #[error(transparent)]
    Intent(#[from] crate::events::IntentError),
}

impl CallError {
    pub fn code(&self) -> &'static str {
        match self {
            CallError::Unauthorized => "invalid_api_key",
            CallError::UnboundSandbox => "unbound_sandbox",
            CallError::BadRequest(_) => "invalid_request",
            CallError::OverCap { .. } => "max_tokens_over_cap",
            CallError::TooLarge(_) => "request_too_large",
            CallError::Unbounded(_) => "unbounded_input",
            CallError::AnswerDeadline(_) => "upstream_timeout",
            CallError::Pricing(_) => "unknown_model",
            CallError::Store(BudgetError::Exhausted { .. }) => "budget_exhausted",
            CallError::Store(_) => "internal",
            CallError::NoUpstream => "no_upstream",
            CallError::Upstream(_) | CallError::BadUpstreamAnswer => "upstream_unavailable",
            CallError::GatewayUnreachable(_) => "gateway_unreachable",
            CallError::PolicyDenied(_) => "policy_denied",
            CallError::ApprovalRequired(_) => "approval_required",
            CallError::ApprovalTimedOut { .. } => "approval_timeout",
            CallError::TooManyApprovals(_) => "too_many_approvals",
            CallError::Policy(_) => "internal",
            CallError::Intent(IntentError::SessionEnded) => "session_ended",
            CallError::Intent(IntentError::NotRecorded(_)) => "log_unavailable",
        }
    }

    /// Label for the calls counter.
    pub fn outcome(&self) -> &'static str {
        match self {
            CallError::Store(BudgetError::Exhausted { .. }) => "budget_exhausted",
            CallError::Upstream(_)
            | CallError::BadUpstreamAnswer
            | CallError::AnswerDeadline(_)
            | CallError::GatewayUnreachable(_) => "upstream_unavailable",
            CallError::Store(_) | CallError::Policy(_) => "internal",
            CallError::PolicyDenied(_)
            | CallError::ApprovalRequired(_)
            | CallError::ApprovalTimedOut { .. }
            | CallError::TooManyApprovals(_) => "policy_refused",
            _ => "refused",
        }
    }

    fn status(&self) -> StatusCode {
        match self {
            CallError::Unauthorized | CallError::UnboundSandbox => StatusCode::UNAUTHORIZED,
            CallError::BadRequest(_)
            | CallError::OverCap { .. }
            | CallError::Pricing(_)
            | CallError::Unbounded(_) => StatusCode::BAD_REQUEST,
            CallError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            CallError::Store(BudgetError::Exhausted { .. }) => StatusCode::TOO_MANY_REQUESTS,
            CallError::Store(_) | CallError::Policy(_) => StatusCode::INTERNAL_SERVER_ERROR,
            CallError::PolicyDenied(_)
            | CallError::ApprovalRequired(_)
            | CallError::ApprovalTimedOut { .. } => StatusCode::FORBIDDEN,
            CallError::TooManyApprovals(_) => StatusCode::SERVICE_UNAVAILABLE,
            CallError::NoUpstream => StatusCode::NOT_FOUND,
            CallError::Upstream(_)
            | CallError::BadUpstreamAnswer
            | CallError::GatewayUnreachable(_) => StatusCode::BAD_GATEWAY,
            CallError::AnswerDeadline(_) => StatusCode::GATEWAY_TIMEOUT,
            CallError::Intent(IntentError::SessionEnded) => StatusCode::CONFLICT,
            CallError::Intent(IntentError::NotRecorded(_)) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    pub fn into_response(self, flavor: Flavor) -> Response {
        let status = self.status();
        // The cause of an internal error is logged, not echoed.
        let message = if status == StatusCode::INTERNAL_SERVER_ERROR {
            let rid = format!("req_{:016x}", rand::random::<u64>());
            let error = hatchery_serve::error_text::with_causes(&self);
            tracing::error!(request_id = %rid, %error, "model call failed");
            format!("internal error (request id {rid})")
        } else {
            self.to_string()
        };
        let body = match flavor {
            Flavor::OpenAi => json!({"error": {
                "message": message,
                "type": match status {
                    StatusCode::TOO_MANY_REQUESTS => "insufficient_quota",
                    StatusCode::UNAUTHORIZED => "invalid_request_error",
                    StatusCode::FORBIDDEN => "permission_error",
                    s if s.is_server_error() => "api_error",
                    _ => "invalid_request_error",
                },
                "param": null,
                "code": self.code(),
            }}),
            Flavor::Anthropic => json!({"type": "error", "error": {
                "type": match status {
                    StatusCode::UNAUTHORIZED => "authentication_error",
                    StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
                    StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
                    StatusCode::NOT_FOUND => "not_found_error",
                    StatusCode::FORBIDDEN => "permission_error",
                    s if s.is_server_error() => "api_error",
                    _ => "invalid_request_error",
                },
                "message": message,
            }}),
        };
        (status, axum::Json(body)).into_response()
    }
}
