//! The one error type of the rounds routes, answered as the API's
//! `{"error":{"code","message"}}` with a fitting status. Store and sandbox
//! failures arrive already typed ([`StoreError`], [`SandboxError`]), so no
//! SQL or HTTP client type leaks into what callers see.

use crate::sandbox::SandboxError;
use crate::store::StoreError;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

#[derive(Debug, thiserror::Error)]
pub enum RoundsError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    TooLarge(String),
    #[error("missing, wrong, altered or expired token")]
    Unauthorized,
    #[error("{0}")]
    Forbidden(String),
    #[error("{0} not found")]
    NotFound(String),
    /// A state guard refused: the message says which state it is in.
    #[error("{message}")]
    State { code: &'static str, message: String },
    #[error("template '{template}' version {version} is gone: {why}")]
    TemplateVersionGone {
        template: String,
        version: String,
        why: String,
    },
    #[error("{0}")]
    Capacity(String),
    /// A room's connection or member cap: 429, try later.
    #[error("{0}")]
    RoomFull(String),
    #[error("sandbox: {0}")]
    Sandbox(#[from] SandboxError),
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("internal: {0}")]
    Internal(String),
    /// Resolving a tenant key failed (503 when the store is only
    /// unreachable, otherwise 500 with the cause in the log).
    #[error("resolving a tenant key")]
    Tenants(#[source] hatchery_tenants::StoreError),
}

pub use hatchery_serve::json_error::{ErrorBody, ErrorDetail};

impl RoundsError {
    pub fn state(code: &'static str, message: impl Into<String>) -> Self {
        RoundsError::State {
            code,
            message: message.into(),
        }
    }

    pub fn status_code(&self) -> (StatusCode, &'static str) {
        use StatusCode as S;
        match self {
            RoundsError::Invalid(_) => (S::BAD_REQUEST, "invalid_request"),
            RoundsError::TooLarge(_) => (S::PAYLOAD_TOO_LARGE, "too_large"),
            RoundsError::Unauthorized => (S::UNAUTHORIZED, "unauthorized"),
            RoundsError::Forbidden(_) => (S::FORBIDDEN, "forbidden"),
            RoundsError::NotFound(what) if what.starts_with("round ") => {
                (S::NOT_FOUND, "round_not_found")
            }
            RoundsError::NotFound(what) if what.starts_with("session ") => {
                (S::NOT_FOUND, "session_not_found")
            }
            RoundsError::NotFound(what) if what.starts_with("replay ") => {
                (S::NOT_FOUND, "replay_not_found")
            }
            RoundsError::NotFound(_) => (S::NOT_FOUND, "not_found"),
            RoundsError::State { code, .. } => (S::CONFLICT, code),
            RoundsError::TemplateVersionGone { .. } => (S::CONFLICT, "template_version_gone"),
            RoundsError::Capacity(_) => (S::SERVICE_UNAVAILABLE, "capacity"),
            RoundsError::RoomFull(_) => (S::TOO_MANY_REQUESTS, "room_full"),
            RoundsError::Sandbox(e) => match e {
                // The round's tenant is at its live-sandbox limit: the
                // sandbox API's own answer, passed on (not a capacity
                // problem a retry soon would fix).
                SandboxError::Api { code, .. } if code == "tenant_limit" => {
                    (S::TOO_MANY_REQUESTS, "tenant_limit")
                }
                SandboxError::Api { status, .. } if *status == 503 || *status == 429 => {
                    (S::SERVICE_UNAVAILABLE, "sandbox_unavailable")
                }
                SandboxError::Api { code, .. } if code == "template_not_found" => {
                    (S::NOT_FOUND, "template_not_found")
                }
                SandboxError::Api { code, .. } if code == "too_large" => {
                    (S::PAYLOAD_TOO_LARGE, "too_large")
                }
                _ => (S::BAD_GATEWAY, "sandbox_error"),
            },
            RoundsError::Store(e) if e.unavailable() => (S::SERVICE_UNAVAILABLE, "unavailable"),
            RoundsError::Store(e) if e.conflict() => (S::CONFLICT, "conflict"),
            RoundsError::Store(_) | RoundsError::Internal(_) => {
                (S::INTERNAL_SERVER_ERROR, "internal")
            }
            RoundsError::Tenants(hatchery_tenants::StoreError::Unavailable(_)) => {
                (S::SERVICE_UNAVAILABLE, "unavailable")
            }
            RoundsError::Tenants(_) => (S::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

impl IntoResponse for RoundsError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_code();
        let message = if status == StatusCode::INTERNAL_SERVER_ERROR {
            // The cause goes to the log under a request id, not to the
            // caller (who may be a candidate).
            let rid = crate::ids::new_id("req");
            let error = hatchery_serve::error_text::with_causes(&self);
            tracing::error!(request_id = %rid, %error, "rounds request failed");
            format!("internal error (request id {rid})")
        } else {
            if matches!(&self, RoundsError::Store(e) if e.unavailable()) {
                // The cause (the database's own words) goes to the log;
                // the caller is told to retry (with Retry-After).
                if let Some(dropped) = crate::ratelimit::STORE_UNAVAILABLE.allow() {
                    tracing::warn!(error = %self, dropped, "rounds: the store is unavailable");
                }
                "the rounds store is not reachable; retry shortly".to_string()
            } else {
                // A candidate can make these happen at will: rate-limited.
                if matches!(self, RoundsError::Sandbox(_)) {
                    if let Some(dropped) = crate::ratelimit::SANDBOX_ERRORS.allow() {
                        tracing::warn!(error = %self, dropped, "rounds: sandbox call failed");
                    }
                }
                self.to_string()
            }
        };
        let retry = status == StatusCode::SERVICE_UNAVAILABLE;
        hatchery_serve::json_error::respond(status, code, message, retry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The database's pool had no connection in time: retryable.
    fn unavailable() -> StoreError {
        StoreError::Db(hatchery_db::DbError::Pool(
            deadpool_postgres::PoolError::Timeout(deadpool_postgres::TimeoutType::Wait),
        ))
    }

    #[test]
    fn codes() {
        assert_eq!(
            RoundsError::NotFound("round rnd_x".into()).status_code(),
            (StatusCode::NOT_FOUND, "round_not_found")
        );
        assert_eq!(
            RoundsError::state("grading_in_progress", "x").status_code(),
            (StatusCode::CONFLICT, "grading_in_progress")
        );
        assert_eq!(
            RoundsError::Unauthorized.status_code().0,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            RoundsError::Store(unavailable()).status_code(),
            (StatusCode::SERVICE_UNAVAILABLE, "unavailable")
        );
        assert_eq!(
            RoundsError::Store(StoreError::Conflict("x".into())).status_code(),
            (StatusCode::CONFLICT, "conflict")
        );
        assert_eq!(
            RoundsError::Store(StoreError::Corrupt("x".into())).status_code(),
            (StatusCode::INTERNAL_SERVER_ERROR, "internal")
        );
    }

    #[test]
    fn a_tenant_s_limit_is_passed_on_as_the_sandbox_api_says_it() {
        let limit = SandboxError::Api {
            status: 429,
            code: "tenant_limit".into(),
            message: "tenant ten_a is at its live_sandboxes limit of 1 (1 in use)".into(),
        };
        assert_eq!(
            RoundsError::Sandbox(limit).status_code(),
            (StatusCode::TOO_MANY_REQUESTS, "tenant_limit")
        );
        let busy = SandboxError::Api {
            status: 429,
            code: "too_many_requests".into(),
            message: String::new(),
        };
        assert_eq!(
            RoundsError::Sandbox(busy).status_code(),
            (StatusCode::SERVICE_UNAVAILABLE, "sandbox_unavailable")
        );
    }

    #[tokio::test]
    async fn an_unavailable_store_is_a_503_with_the_error_shape() {
        let resp = RoundsError::Store(unavailable()).into_response();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(resp.headers()["retry-after"], "1");
        let body = axum::body::to_bytes(resp.into_body(), 1 << 16)
            .await
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["code"], "unavailable");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains("retry"), "{msg}");
        assert!(!msg.contains("pool"), "the cause stays in the log: {msg}");
    }
}
