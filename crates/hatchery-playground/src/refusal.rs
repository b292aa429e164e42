//! Refusals: each is a JSON error body with a stable code the widget maps to
//! a kind message, and Retry-After where waiting helps.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("the snippet is over {0} bytes")]
    TooLarge(usize),
    #[error("the request body is not JSON of the form {{\"code\": \"...\", \"template\": \"...\"}}: {0}")]
    InvalidJson(String),
    #[error("too many runs from here; try again in {} s", secs(*.0))]
    RateLimited(Duration),
    #[error("the playground is busy; try again in a moment")]
    Busy,
    #[error("unknown template {0:?}")]
    UnknownTemplate(String),
    #[error("no such page")]
    NotFound,
    #[error("method not allowed")]
    MethodNotAllowed,
}

fn secs(d: Duration) -> u64 {
    d.as_secs_f64().ceil().max(1.0) as u64
}

impl Refusal {
    /// Stable code; also the `reason` label in metrics and the runs table.
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::TooLarge(_) => "too_large",
            Refusal::InvalidJson(_) => "invalid_json",
            Refusal::RateLimited(_) => "rate_limited",
            Refusal::Busy => "busy",
            Refusal::UnknownTemplate(_) => "unknown_template",
            Refusal::NotFound => "not_found",
            Refusal::MethodNotAllowed => "method_not_allowed",
        }
    }

    fn status(&self) -> StatusCode {
        match self {
            Refusal::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Refusal::InvalidJson(_) | Refusal::UnknownTemplate(_) => StatusCode::BAD_REQUEST,
            Refusal::RateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
            Refusal::Busy => StatusCode::SERVICE_UNAVAILABLE,
            Refusal::NotFound => StatusCode::NOT_FOUND,
            Refusal::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
        }
    }

    fn retry_after(&self) -> Option<u64> {
        match self {
            Refusal::RateLimited(d) => Some(secs(*d)),
            Refusal::Busy => Some(2),
            _ => None,
        }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let body = json!({"error": {"code": self.code(), "message": self.to_string()}});
        let mut r = (self.status(), axum::Json(body)).into_response();
        if let Some(s) = self.retry_after() {
            if let Ok(v) = HeaderValue::from_str(&s.to_string()) {
                r.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        r
    }
}
