use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// Why a request could not be routed. Every variant answers in the API's
/// error shape; the retryable ones (503) carry Retry-After.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    #[error("the state store is unavailable: {0}")]
    Store(String),
    #[error("host {host} owns {what} but is lost (no heartbeat within its lease)")]
    HostLost { host: String, what: String },
    #[error("host {host} is unreachable: {cause}")]
    Unreachable { host: String, cause: String },
    #[error("no host has room for a sandbox")]
    NoCapacity,
    #[error("no live host registered")]
    NoHost,
    #[error("{1} not found")]
    NotFound(&'static str, String),
    #[error("missing or wrong API key")]
    Unauthorized,
    #[error("request body: {0}")]
    Body(String),
    #[error("request body over {0} bytes")]
    TooLarge(usize),
}

impl RouteError {
    pub fn code(&self) -> &'static str {
        match self {
            RouteError::Store(_) => "store_unavailable",
            RouteError::HostLost { .. } => "host_lost",
            RouteError::Unreachable { .. } => "host_unreachable",
            RouteError::NoCapacity => "capacity",
            RouteError::NoHost => "no_host",
            RouteError::NotFound(code, _) => code,
            RouteError::Unauthorized => "unauthorized",
            RouteError::Body(_) => "invalid_request",
            RouteError::TooLarge(_) => "too_large",
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            RouteError::NotFound(..) => StatusCode::NOT_FOUND,
            RouteError::Unauthorized => StatusCode::UNAUTHORIZED,
            RouteError::Body(_) => StatusCode::BAD_REQUEST,
            RouteError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            _ => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

impl IntoResponse for RouteError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            tracing::warn!(error = %self, code = self.code(), "request not routed");
        }
        let message = match &self {
            // The store's own words stay in the log.
            RouteError::Store(_) => "the state store is unavailable; retry shortly".to_string(),
            e => e.to_string(),
        };
        let body = serde_json::json!({"error": {"code": self.code(), "message": message}});
        let mut resp = (status, axum::Json(body)).into_response();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            resp.headers_mut()
                .insert("retry-after", HeaderValue::from_static("2"));
        }
        resp
    }
}
