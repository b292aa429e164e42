use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use hatchery_core::CoreError;
use hatchery_net::NetError;
use hatchery_runtime::RuntimeError;
use hatchery_templates::TemplateError;

/// Every error the API returns.
#[derive(Debug, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

pub use hatchery_serve::json_error::{ErrorBody, ErrorDetail};

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }
    pub fn body(&self) -> ErrorBody {
        ErrorBody::new(self.code, self.message.clone())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        // `too_many` and `too_many_terminals` cap what the caller itself
        // keeps running or open: a retry in a second would fail the same
        // way, so they get no hint.
        let retry = (self.status == StatusCode::SERVICE_UNAVAILABLE
            || self.status == StatusCode::TOO_MANY_REQUESTS)
            && !matches!(self.code, "too_many" | "too_many_terminals");
        let building = self.code == "template_building";
        let mut r =
            hatchery_serve::json_error::respond(self.status, self.code, self.message, retry);
        if building {
            // A build takes seconds to minutes: no point asking every second.
            r.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static(TEMPLATE_BUILDING_RETRY_AFTER),
            );
        }
        r
    }
}

/// Seconds a create of a template still being built is told to wait.
pub const TEMPLATE_BUILDING_RETRY_AFTER: &str = "5";

/// `req_` and 16 random characters: what a caller quotes to an operator,
/// who finds the cause in the daemon's log under `request_id`.
pub fn new_request_id() -> String {
    format!("req_{}", &hatchery_core::new_sandbox_id()[4..])
}

/// The message of an error that is the daemon's own fault.
fn hidden_cause(code: &str, request_id: &str) -> String {
    let what = if code == "runtime_error" {
        "the sandbox runtime failed"
    } else {
        "internal error"
    };
    format!("{what} (request id {request_id}); the cause is in the daemon's log")
}

impl From<CoreError> for ApiError {
    fn from(e: CoreError) -> Self {
        use StatusCode as S;
        if let CoreError::Store(se) = &e {
            // A database that is down, or a host whose lease was taken
            // over: retryable (503 + Retry-After), the cause only logged.
            if se.is_unavailable() || se.is_fenced() {
                tracing::error!(error = %se, "state store unavailable");
                return ApiError::new(
                    S::SERVICE_UNAVAILABLE,
                    "store_unavailable",
                    "the state store is unavailable; retry shortly".to_string(),
                );
            }
        }
        let msg = e.to_string();
        let (status, code) = match &e {
            CoreError::SandboxNotFound(_) => (S::NOT_FOUND, "sandbox_not_found"),
            CoreError::Template(TemplateError::NotFound(_)) => (S::NOT_FOUND, "template_not_found"),
            CoreError::TemplateBuilding { .. } => (S::SERVICE_UNAVAILABLE, "template_building"),
            CoreError::Template(TemplateError::InvalidName(_)) => {
                (S::BAD_REQUEST, "invalid_template_name")
            }
            CoreError::Template(TemplateError::Broken { .. }) => {
                (S::INTERNAL_SERVER_ERROR, "template_broken")
            }
            CoreError::Template(TemplateError::Invalid(_)) => (S::BAD_REQUEST, "invalid_request"),
            CoreError::Template(_) => (S::INTERNAL_SERVER_ERROR, "template_error"),
            CoreError::Conflict(_) => (S::CONFLICT, "conflict"),
            CoreError::Invalid(_) => (S::BAD_REQUEST, "invalid_request"),
            CoreError::FileNotFound(_) => (S::NOT_FOUND, "file_not_found"),
            CoreError::FileConflict(_) => (S::CONFLICT, "file_conflict"),
            CoreError::TooLarge(_) => (S::PAYLOAD_TOO_LARGE, "too_large"),
            CoreError::Capacity(_) => (S::SERVICE_UNAVAILABLE, "capacity"),
            CoreError::TooManyTerminals(_) => (S::TOO_MANY_REQUESTS, "too_many_terminals"),
            CoreError::NotRunning(_) => (S::CONFLICT, "sandbox_not_running"),
            CoreError::GuestUnresponsive(_) => (S::GATEWAY_TIMEOUT, "guest_unresponsive"),
            // 507: the sandbox ran out of the memory it was given.
            CoreError::SandboxOom { reason, .. } => (S::INSUFFICIENT_STORAGE, *reason),
            CoreError::Guest { code, .. } if code == "not_found" => (S::NOT_FOUND, "not_found"),
            CoreError::Guest { code, .. } if code == "permission_denied" => {
                (S::FORBIDDEN, "permission_denied")
            }
            CoreError::Guest { code, .. } if code == "not_a_regular_file" => {
                (S::BAD_REQUEST, "not_a_regular_file")
            }
            CoreError::Guest { .. } => (S::UNPROCESSABLE_ENTITY, "guest_error"),
            CoreError::Runtime(RuntimeError::NotFound(_)) => (S::NOT_FOUND, "sandbox_not_found"),
            CoreError::Runtime(RuntimeError::Unsupported(..)) => (S::CONFLICT, "unsupported"),
            CoreError::Runtime(RuntimeError::TooLarge { .. }) => (S::CONFLICT, "files_too_large"),
            CoreError::Runtime(_) => (S::SERVICE_UNAVAILABLE, "runtime_error"),
            CoreError::SnapshotNotFound(_) => (S::NOT_FOUND, "snapshot_not_found"),
            CoreError::SnapshotStoreFull { .. } => (S::INSUFFICIENT_STORAGE, "snapshot_store_full"),
            CoreError::ContextNotFound(_) => (S::NOT_FOUND, "context_not_found"),
            CoreError::ProcessNotFound(_) => (S::NOT_FOUND, "process_not_found"),
            CoreError::TooMany(_) => (S::TOO_MANY_REQUESTS, "too_many"),
            CoreError::SnapshotCorrupt(_) => (S::UNPROCESSABLE_ENTITY, "snapshot_corrupt"),
            CoreError::Network(n) => match n {
                NetError::Invalid(_) | NetError::Resolve(..) => {
                    (S::BAD_REQUEST, "invalid_network_policy")
                }
                NetError::Exhausted(_) => (S::SERVICE_UNAVAILABLE, "network_exhausted"),
                NetError::Busy(_) => (S::CONFLICT, "conflict"),
                NetError::Command(_) | NetError::Io(_) => {
                    (S::INTERNAL_SERVER_ERROR, "network_error")
                }
            },
            CoreError::PortClosed(_) => (S::BAD_GATEWAY, "port_closed"),
            CoreError::BadGateway(_) => (S::BAD_GATEWAY, "bad_gateway"),
            CoreError::ServiceWorkerRefused => (S::FORBIDDEN, "service_worker_refused"),
            CoreError::TooManyConnections(_) => (S::TOO_MANY_REQUESTS, "too_many_connections"),
            CoreError::HostService(_) => (S::BAD_REQUEST, "invalid_host_service"),
            CoreError::Store(_) | CoreError::Internal(_) => (S::INTERNAL_SERVER_ERROR, "internal"),
        };
        // Only daemon-side faults: guest-triggered ones (504) are logged,
        // rate-limited, by the core. Their cause (runsc's log lines, host
        // paths, SQL) goes to the log under a request id, not to the caller.
        if status == S::INTERNAL_SERVER_ERROR || code == "runtime_error" {
            let request_id = new_request_id();
            tracing::error!(code, request_id = %request_id, error = %msg, "request failed");
            return ApiError::new(status, code, hidden_cause(code, &request_id));
        }
        ApiError::new(status, code, msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_daemon_fault_names_a_request_id_not_its_cause() {
        let e: ApiError = CoreError::Runtime(RuntimeError::Start(
            "runsc run failed: /var/lib/hatchery/sandboxes/sbx_x/runsc.log".into(),
        ))
        .into();
        assert_eq!((e.status.as_u16(), e.code), (503, "runtime_error"));
        assert!(!e.message.contains("/var/lib"), "{}", e.message);
        assert!(e.message.contains("request id req_"), "{}", e.message);
        let e: ApiError = CoreError::Internal("disk I/O error at /data/state.db".into()).into();
        assert_eq!((e.status.as_u16(), e.code), (500, "internal"));
        assert!(
            !e.message.contains("state.db") && e.message.contains("req_"),
            "{}",
            e.message
        );
        // A caller's own mistake keeps its explanation.
        let e: ApiError = CoreError::Invalid("cols must be between 1 and 1000".into()).into();
        assert_eq!(e.message, "cols must be between 1 and 1000");
        let e: ApiError = CoreError::TemplateBuilding {
            name: "base".into(),
            step: "setup".into(),
            percent: 60,
        }
        .into();
        assert_eq!((e.status.as_u16(), e.code), (503, "template_building"));
        assert!(
            e.message.contains("'base'") && e.message.contains("60%"),
            "{}",
            e.message
        );
        let r = e.into_response();
        assert_eq!(r.headers()[axum::http::header::RETRY_AFTER], "5");
        let a = new_request_id();
        assert!(a.len() == 20 && a.starts_with("req_") && a != new_request_id());
    }
}
