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
    #[error("{what} was lost with its host {host} at {} ({at_ms} unix ms): {reason}", rfc3339(*at_ms))]
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

/// A request of E2B's API (hatchery-e2b), answered in E2B's error shape.
pub(crate) fn is_e2b(path: &str) -> bool {
    path.starts_with("/e2b/")
}

impl RouteError {
    /// The answer to an E2B client: a lost sandbox is E2B's 404
    /// `{"code": 404, "message"}` (its SDKs raise their not-found error;
    /// the message says it was lost, with its host, when and why); any
    /// other error as [`IntoResponse`] answers it.
    pub fn into_e2b_response(self) -> Response {
        match &self {
            RouteError::SandboxLost { .. } => (
                StatusCode::NOT_FOUND,
                axum::Json(serde_json::json!({"code": 404, "message": self.to_string()})),
            )
                .into_response(),
            _ => self.into_response(),
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

/// `at_ms` (unix ms) as RFC 3339 UTC, for people reading the message.
fn rfc3339(at_ms: u64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(at_ms as i128 * 1_000_000)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| "an unknown time".into())
}

#[cfg(test)]
mod lost_message_tests {
    #[tokio::test]
    async fn an_e2b_client_gets_its_own_404_shape_saying_lost() {
        let lost = || super::RouteError::SandboxLost {
            host: "h1".into(),
            what: "sandbox sbx_a".into(),
            at_ms: 1_765_000_000_000,
            reason: "r".into(),
        };
        let r = lost().into_e2b_response();
        assert_eq!(r.status(), axum::http::StatusCode::NOT_FOUND);
        let b = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v["code"], 404);
        assert!(
            v["message"]
                .as_str()
                .unwrap()
                .contains("was lost with its host h1"),
            "{v}"
        );
        // The v1 API keeps 410 and its fields.
        let r = axum::response::IntoResponse::into_response(lost());
        assert_eq!(r.status(), axum::http::StatusCode::GONE);
        assert!(super::is_e2b("/e2b/sandboxes/x") && !super::is_e2b("/v1/sandboxes/x"));
    }

    #[test]
    fn a_lost_sandbox_says_when_in_words_and_in_ms() {
        let e = super::RouteError::SandboxLost {
            host: "h1".into(),
            what: "sandbox sbx_a".into(),
            at_ms: 1_765_000_000_123,
            reason: "its host stopped heartbeating".into(),
        };
        assert_eq!(
            e.to_string(),
            "sandbox sbx_a was lost with its host h1 at 2025-12-06T05:46:40.123Z (1765000000123 unix ms): its host stopped heartbeating"
        );
    }
}
