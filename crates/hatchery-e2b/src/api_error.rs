//! The control plane's errors as E2B answers them: a status and
//! `{"code": <status>, "message"}`, and the JSON body extractor that
//! refuses in that shape. Shared by the control plane's handlers
//! (`control`, `snapshots`), by pause and resume (`pause_resume`) and by
//! the sandbox side where it answers a backend failure the same way
//! (`sandbox`, `files`, `interpreter`), so none of them needs another's
//! module for it.

use crate::backend::{BackendError, FailKind};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// Seconds to send as `Retry-After`, for a refusal that passes.
    pub retry_after: Option<u32>,
}

/// Seconds a create of a template still being built is told to wait.
pub const TEMPLATE_BUILDING_RETRY_AFTER: u32 = 5;

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            retry_after: None,
        }
    }
    pub(crate) fn bad(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }
    pub(crate) fn not_found(id: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            format!("sandbox \"{id}\" was not found"),
        )
    }
}

impl From<BackendError> for ApiError {
    fn from(e: BackendError) -> Self {
        let status = match e.kind {
            FailKind::SandboxNotFound
            | FailKind::TemplateNotFound
            | FailKind::SnapshotNotFound
            | FailKind::FileNotFound
            | FailKind::ProcessNotFound
            | FailKind::ContextNotFound => StatusCode::NOT_FOUND,
            FailKind::Invalid | FailKind::WrongType => StatusCode::BAD_REQUEST,
            FailKind::Conflict | FailKind::NotRunning => StatusCode::CONFLICT,
            FailKind::PermissionDenied => StatusCode::FORBIDDEN,
            FailKind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            FailKind::TooMany => StatusCode::TOO_MANY_REQUESTS,
            FailKind::Capacity | FailKind::NoSpace | FailKind::TemplateBuilding => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            FailKind::PortClosed => StatusCode::BAD_GATEWAY,
            FailKind::Unresponsive => StatusCode::GATEWAY_TIMEOUT,
            FailKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        };
        if status == StatusCode::INTERNAL_SERVER_ERROR {
            tracing::error!(error = %e.message, "e2b control plane: internal error");
            return ApiError::new(status, "internal error (see the daemon log)");
        }
        let retry_after =
            (e.kind == FailKind::TemplateBuilding).then_some(TEMPLATE_BUILDING_RETRY_AFTER);
        ApiError {
            retry_after,
            ..ApiError::new(status, e.message)
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (
            self.status,
            Json(json!({"code": self.status.as_u16(), "message": self.message})),
        )
            .into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, s.into());
        }
        r
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

/// A JSON body, with failures in E2B's error shape. An empty body is `{}`.
pub struct Body<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> axum::extract::FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|e| ApiError::new(e.status(), e.body_text()))?;
        let bytes = if bytes.iter().all(u8::is_ascii_whitespace) {
            axum::body::Bytes::from_static(b"{}")
        } else {
            bytes
        };
        serde_json::from_slice(&bytes)
            .map(Body)
            .map_err(|e| ApiError::bad(format!("invalid request body: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_template_still_building_is_503_with_retry_after() {
        let r = ApiError::from(BackendError::new(FailKind::TemplateBuilding, "building"))
            .into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[axum::http::header::RETRY_AFTER], "5");
        let r = ApiError::from(BackendError::new(FailKind::TemplateNotFound, "no")).into_response();
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
        assert!(r.headers().get(axum::http::header::RETRY_AFTER).is_none());
    }
}
