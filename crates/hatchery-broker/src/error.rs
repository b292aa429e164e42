//! The broker's errors and how they answer over HTTP
//! (`{"error":{"code","message"}}`; a 500 says `internal` and a request id,
//! the cause goes to the log).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("{0}")]
    BadRequest(String),
    #[error("missing or wrong API key")]
    Unauthorized,
    #[error("unknown tool {0:?}; broker tools are {1}")]
    UnknownTool(String, String),
    /// The connection did not come through a sandbox's broker endpoint,
    /// or from a sandbox no session holds.
    #[error("{0}")]
    UnknownSandbox(String),
    /// A replaced sandbox instance (the session resumed or forked).
    #[error("{0}")]
    Fenced(String),
    #[error("seq {seq} was already used for another call ({tool} with other arguments)")]
    SeqConflict { seq: u64, tool: String },
    #[error("{0}")]
    SessionState(String),
    #[error("{0}")]
    CallNotFound(String),
    /// A resolution for a call that is not (or no longer) `needs_review`.
    #[error("{0}")]
    NotNeedsReview(String),
    #[error("the session's policy {0} could not be loaded: {1}")]
    PolicyUnavailable(String, String),
    /// Something the broker needs is briefly not there (the daemon is
    /// starting); nothing was done, ask again.
    #[error("try again: {0}")]
    Unavailable(String),
    /// A per-session cap (docs/sessions.md, "Caps"): nothing was
    /// recorded for the call. `retry_after` for the rate cap.
    #[error("{message}")]
    SessionCap {
        code: &'static str,
        message: String,
        retry_after: Option<u64>,
    },
    #[error("{0}")]
    Internal(String),
}

impl From<crate::store::StoreError> for BrokerError {
    fn from(e: crate::store::StoreError) -> Self {
        if e.unavailable() {
            // The database is briefly not there: nothing was done, the
            // caller may ask again (503, like the other stores).
            BrokerError::Unavailable(e.to_string())
        } else {
            BrokerError::Internal(e.to_string())
        }
    }
}

impl From<hatchery_sessions::error::SessionError> for BrokerError {
    fn from(e: hatchery_sessions::error::SessionError) -> Self {
        use hatchery_sessions::error::SessionError as S;
        match e {
            // The session's store or its owning host is out of reach for
            // now (or the session is moving hosts): nothing was done, the
            // agent asks again with the same seq.
            S::StoreUnavailable(m) | S::Moved(m) => {
                BrokerError::Unavailable(format!("sessions: {m}"))
            }
            e => BrokerError::Internal(format!("sessions: {e}")),
        }
    }
}

impl BrokerError {
    pub fn status_code(&self) -> (StatusCode, &'static str) {
        use StatusCode as S;
        match self {
            BrokerError::BadRequest(_) => (S::BAD_REQUEST, "invalid_request"),
            BrokerError::Unauthorized => (S::UNAUTHORIZED, "unauthorized"),
            BrokerError::UnknownTool(..) => (S::BAD_REQUEST, "unknown_tool"),
            BrokerError::UnknownSandbox(_) => (S::FORBIDDEN, "unknown_sandbox"),
            BrokerError::Fenced(_) => (S::CONFLICT, "fenced"),
            BrokerError::SeqConflict { .. } => (S::CONFLICT, "seq_conflict"),
            BrokerError::SessionState(_) => (S::CONFLICT, "session_state_conflict"),
            BrokerError::CallNotFound(_) => (S::NOT_FOUND, "call_not_found"),
            BrokerError::NotNeedsReview(_) => (S::CONFLICT, "not_needs_review"),
            BrokerError::PolicyUnavailable(..) => (S::SERVICE_UNAVAILABLE, "policy_unavailable"),
            BrokerError::Unavailable(_) => (S::SERVICE_UNAVAILABLE, "unavailable"),
            BrokerError::SessionCap { code, .. } => (S::TOO_MANY_REQUESTS, code),
            BrokerError::Internal(_) => (S::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

impl IntoResponse for BrokerError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_code();
        let retry_after = match &self {
            BrokerError::SessionCap { retry_after, .. } => *retry_after,
            _ => None,
        };
        let message = if status == StatusCode::INTERNAL_SERVER_ERROR {
            let request_id = format!("req_{:016x}", rand_u64());
            tracing::error!(%request_id, error = %self, "broker failed");
            format!("internal error (request id {request_id})")
        } else {
            self.to_string()
        };
        let mut r = (
            status,
            Json(serde_json::json!({"error": {"code": code, "message": message}})),
        )
            .into_response();
        if let Some(s) = retry_after {
            r.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, s.into());
        }
        r
    }
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store whose database is not there answers `unavailable` (503,
    /// the caller may ask again), not a generic 500.
    #[tokio::test]
    async fn a_store_that_is_down_is_unavailable() {
        let db = hatchery_db::Db::postgres("postgres://postgres@127.0.0.1:1/hatchery", 1).unwrap();
        let Err(e) = crate::store::BrokerStore::open(db).await else {
            panic!("connected to port 1")
        };
        let e = BrokerError::from(e);
        assert!(matches!(e, BrokerError::Unavailable(_)), "{e:?}");
        assert_eq!(
            e.status_code(),
            (StatusCode::SERVICE_UNAVAILABLE, "unavailable")
        );
    }
}
