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
    #[error("host {host} owns {what} but is starting (not yet reconciled and listening)")]
    HostStarting { host: String, what: String },
    #[error("{what} was lost with its host {host} at {at_ms} (unix ms): {reason}")]
    SandboxLost {
        host: String,
        what: String,
        at_ms: u64,
        reason: String,
    },
    #[error("host {host} is unreachable: {cause}")]
    Unreachable { host: String, cause: String },
    #[error("no host has room for a sandbox")]
    NoCapacity,
    #[error(
        "no host is ready for new sandboxes: every live host is cordoned, draining or starting"
    )]
    NoReadyHost,
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
            RouteError::HostStarting { .. } => "host_starting",
            RouteError::SandboxLost { .. } => "sandbox_lost",
            RouteError::Unreachable { .. } => "host_unreachable",
            RouteError::NoCapacity => "capacity",
            RouteError::NoHost => "no_host",
            RouteError::NoReadyHost => "no_ready_host",
            RouteError::NotFound(code, _) => code,
            RouteError::Unauthorized => "unauthorized",
            RouteError::Body(_) => "invalid_request",
            RouteError::TooLarge(_) => "too_large",
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            RouteError::NotFound(..) => StatusCode::NOT_FOUND,
            RouteError::SandboxLost { .. } => StatusCode::GONE,
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
        let mut body = serde_json::json!({"error": {"code": self.code(), "message": message}});
        // When and why, as fields a client need not parse out of the text.
        if let RouteError::SandboxLost {
            host,
            at_ms,
            reason,
            ..
        } = &self
        {
            body["error"]["host"] = host.as_str().into();
            body["error"]["lost_at_ms"] = (*at_ms).into();
            body["error"]["reason"] = reason.as_str().into();
        }
        let mut resp = (status, axum::Json(body)).into_response();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            resp.headers_mut()
                .insert("retry-after", HeaderValue::from_static("2"));
        }
        resp
    }
}
