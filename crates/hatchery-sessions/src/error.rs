//! API errors of the sessions routes, in the daemon's JSON shape.

use crate::sandbox::SandboxError;
use crate::store::StoreError;
use crate::validate::ValidationError;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Validation(#[from] ValidationError),
    #[error("{code}: {message}")]
    Request { code: &'static str, message: String },
    #[error("policy {0:?} not found")]
    UnknownPolicy(String),
    #[error("template {0:?} not found")]
    UnknownTemplate(String),
    #[error("session {0} not found")]
    NotFound(String),
    #[error("approval {0} not found or already decided")]
    ApprovalNotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("idempotency key already used for session {0} with a different request")]
    IdempotencyConflict(String),
    #[error("{0} event streams are open; the cap is reached")]
    TooManyStreams(usize),
    #[error("blob {0} not found")]
    BlobNotFound(String),
    #[error("sandboxes: {0}")]
    Sandbox(SandboxError),
    /// The session's host changed (take-over): this host may not write it.
    #[error("{0}")]
    Moved(String),
    /// The session store is down; retry.
    #[error("{0}")]
    StoreUnavailable(String),
    #[error("internal: {0}")]
    Internal(String),
    /// An environment named by a create (not found, not built, ...).
    #[error(transparent)]
    Environment(#[from] crate::environments::EnvError),
    /// The tenant's limits have no room for the session's budget.
    #[error("the tenant's {} limit is {}: {} held, {} asked", .0.limit, .0.max, .0.held, .0.asked)]
    TenantBudget(crate::store::NoRoom),
    /// Resolving a tenant key failed (503 when the store is only
    /// unreachable, otherwise 500 with the cause in the log).
    #[error("resolving a tenant key")]
    Tenants(#[source] hatchery_tenants::StoreError),
}

impl From<StoreError> for SessionError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound(id) => SessionError::NotFound(id),
            StoreError::StateConflict { id, current } => {
                SessionError::Conflict(format!("session {id} is {current}"))
            }
            StoreError::ApprovalNotFound(a) => SessionError::ApprovalNotFound(a),
            e @ StoreError::Fenced { .. } => SessionError::Moved(e.to_string()),
            StoreError::Unavailable(m) => SessionError::StoreUnavailable(m),
            StoreError::Config(m) | StoreError::Data(m) => SessionError::Internal(m),
            e @ (StoreError::Db(_) | StoreError::Schema(_)) => {
                SessionError::Internal(hatchery_db_chain(&e))
            }
        }
    }
}

impl SessionError {
    pub fn bad(code: &'static str, message: impl Into<String>) -> Self {
        SessionError::Request {
            code,
            message: message.into(),
        }
    }
    fn status_code(&self) -> (StatusCode, &'static str) {
        use StatusCode as S;
        match self {
            SessionError::Validation(ValidationError::Repo(_)) => (S::BAD_REQUEST, "invalid_repo"),
            SessionError::Validation(ValidationError::Budget(_)) => {
                (S::BAD_REQUEST, "invalid_budget")
            }
            SessionError::Validation(ValidationError::Invalid(_)) => {
                (S::BAD_REQUEST, "invalid_request")
            }
            SessionError::Request { code, .. } => {
                let status = match *code {
                    "unsupported_media_type" => S::UNSUPPORTED_MEDIA_TYPE,
                    "too_large" => S::PAYLOAD_TOO_LARGE,
                    _ => S::BAD_REQUEST,
                };
                (status, code)
            }
            SessionError::UnknownPolicy(_) => (S::BAD_REQUEST, "policy_not_found"),
            SessionError::UnknownTemplate(_) => (S::NOT_FOUND, "template_not_found"),
            SessionError::NotFound(_) => (S::NOT_FOUND, "session_not_found"),
            SessionError::ApprovalNotFound(_) => (S::NOT_FOUND, "approval_not_found"),
            SessionError::Conflict(_) => (S::CONFLICT, "session_state_conflict"),
            SessionError::IdempotencyConflict(_) => (S::CONFLICT, "idempotency_conflict"),
            SessionError::TooManyStreams(_) => (S::SERVICE_UNAVAILABLE, "too_many_streams"),
            SessionError::BlobNotFound(_) => (S::NOT_FOUND, "blob_not_found"),
            SessionError::Sandbox(SandboxError::Capacity(_)) => {
                (S::SERVICE_UNAVAILABLE, "capacity")
            }
            SessionError::Sandbox(_) => (S::BAD_GATEWAY, "sandbox_error"),
            SessionError::Moved(_) => (S::CONFLICT, "session_moved"),
            SessionError::StoreUnavailable(_) => (S::SERVICE_UNAVAILABLE, "store_unavailable"),
            SessionError::Internal(_) => (S::INTERNAL_SERVER_ERROR, "internal"),
            // Answered by the environment's own error (into_response).
            SessionError::Environment(_) => (S::INTERNAL_SERVER_ERROR, "internal"),
            SessionError::Tenants(hatchery_tenants::StoreError::Unavailable(_)) => {
                (S::SERVICE_UNAVAILABLE, "store_unavailable")
            }
            // A key of a tenant deleted since the key was resolved.
            SessionError::Tenants(hatchery_tenants::StoreError::NotFound(_)) => {
                (S::UNAUTHORIZED, "unauthorized")
            }
            SessionError::Tenants(_) => (S::INTERNAL_SERVER_ERROR, "internal"),
            SessionError::TenantBudget(_) => (S::TOO_MANY_REQUESTS, "tenant_budget_exhausted"),
        }
    }
}

pub use hatchery_serve::json_error::{ErrorBody, ErrorDetail};

impl IntoResponse for SessionError {
    fn into_response(self) -> Response {
        if let SessionError::Environment(e) = self {
            return e.into_response();
        }
        let (status, code) = self.status_code();
        let message = if status == StatusCode::INTERNAL_SERVER_ERROR {
            // The cause goes to the log, the caller gets an id to quote.
            let rid = crate::ids::new_id("req");
            let error = hatchery_serve::error_text::with_causes(&self);
            tracing::error!(request_id = %rid, %error, "sessions request failed");
            format!("internal error (request id {rid})")
        } else {
            self.to_string()
        };
        let retry = status == StatusCode::SERVICE_UNAVAILABLE;
        hatchery_serve::json_error::respond(status, code, message, retry)
    }
}

/// A database error's text with its causes, for the log line of a 500
/// (the API answers no more than "internal").
fn hatchery_db_chain(e: &StoreError) -> String {
    let mut s = e.to_string();
    let mut cur = std::error::Error::source(e);
    while let Some(c) = cur {
        s += &format!(": {c}");
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_faults_map_to_their_statuses() {
        let down: SessionError = StoreError::Unavailable("connection refused".into()).into();
        let r = down.into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()["retry-after"], "1");
        let moved: SessionError = StoreError::Fenced {
            id: "ses_a".into(),
            owner: "h2".into(),
            epoch: 2,
        }
        .into();
        assert_eq!(moved.status_code(), (StatusCode::CONFLICT, "session_moved"));
    }
}
