//! The API's error shape, `{"error":{"code","message"}}`, one definition
//! for every product's routes (the daemon's API, sessions, rounds, policies,
//! tenants), so the OpenAPI documents and the answers cannot drift apart.
//! Each product keeps its own error enum and decides status, code and
//! message (and what to hide behind a request id); this module only shapes
//! the answer.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    /// Stable, machine-readable code, e.g. `sandbox_not_found`.
    pub code: String,
    pub message: String,
}

impl ErrorBody {
    pub fn new(code: &str, message: impl Into<String>) -> Self {
        ErrorBody {
            error: ErrorDetail {
                code: code.to_string(),
                message: message.into(),
            },
        }
    }
}

/// The JSON error answer; with `retry`, `Retry-After: 1` (the condition is
/// expected to pass: a store coming back, a slot freeing up).
pub fn respond(
    status: StatusCode,
    code: &str,
    message: impl Into<String>,
    retry: bool,
) -> Response {
    let mut r = (status, axum::Json(ErrorBody::new(code, message))).into_response();
    if retry {
        r.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            HeaderValue::from_static("1"),
        );
    }
    r
}

/// A route's error when status, code and message are all it carries. A 503
/// says when to retry.
#[derive(Debug, thiserror::Error)]
#[error("{code}: {message}")]
pub struct HttpError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl HttpError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        HttpError {
            status,
            code,
            message: message.into(),
        }
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let retry = self.status == StatusCode::SERVICE_UNAVAILABLE;
        respond(self.status, self.code, self.message, retry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn parts(r: Response) -> (StatusCode, Option<String>, serde_json::Value) {
        let status = r.status();
        let retry = r
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_string());
        let body = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
        (status, retry, serde_json::from_slice(&body).unwrap())
    }

    #[tokio::test]
    async fn the_shape_and_the_retry_hint() {
        let (s, retry, body) =
            parts(HttpError::new(StatusCode::NOT_FOUND, "x_not_found", "no x").into_response())
                .await;
        assert_eq!(s, StatusCode::NOT_FOUND);
        assert_eq!(retry, None);
        assert_eq!(
            body,
            serde_json::json!({"error": {"code": "x_not_found", "message": "no x"}})
        );
        let (s, retry, _) = parts(
            HttpError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_unavailable",
                "later",
            )
            .into_response(),
        )
        .await;
        assert_eq!(
            (s, retry.as_deref()),
            (StatusCode::SERVICE_UNAVAILABLE, Some("1"))
        );
        let (_, retry, _) = parts(respond(
            StatusCode::TOO_MANY_REQUESTS,
            "busy",
            "later",
            true,
        ))
        .await;
        assert_eq!(retry.as_deref(), Some("1"));
    }
}
