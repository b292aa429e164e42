//! The one error type of the client: every variant that comes from a call
//! names the call (`method` and `path`, never the key).

use crate::sse::SseError;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The base URL is not `http://host[:port][/prefix]`.
    #[error("invalid daemon URL {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },
    /// Caught before sending: the daemon would refuse it anyway.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("{method} {path}: cannot reach the daemon at {addr}: {source}")]
    Connect {
        method: String,
        path: String,
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{method} {path}: HTTP error talking to the daemon: {source}")]
    Http {
        method: String,
        path: String,
        #[source]
        source: hyper::Error,
    },
    #[error("{method} {path}: timed out after {after:?}")]
    Timeout {
        method: String,
        path: String,
        after: Duration,
    },
    /// The daemon answered with an error status (its JSON error body).
    #[error("{method} {path}: {status} {code}: {message}")]
    Api {
        method: String,
        path: String,
        status: u16,
        code: String,
        message: String,
    },
    /// A stream ended with an `error` (or `failed`) event: the request was
    /// accepted (200) and failed later.
    #[error("{method} {path}: stream failed: {code}: {message}")]
    Stream {
        method: String,
        path: String,
        code: String,
        message: String,
    },
    #[error("{method} {path}: response over {limit} bytes")]
    TooLarge {
        method: String,
        path: String,
        limit: usize,
    },
    #[error("{method} {path}: unexpected response: {detail}")]
    Protocol {
        method: String,
        path: String,
        detail: String,
    },
    #[error("{method} {path}: {source}")]
    Sse {
        method: String,
        path: String,
        #[source]
        source: SseError,
    },
}

impl ClientError {
    /// The HTTP status of an API error.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Api { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The daemon's error code (`not_found`, `capacity`, `too_large`, ...),
    /// from an error answer or a stream's error event.
    pub fn code(&self) -> Option<&str> {
        match self {
            ClientError::Api { code, .. } | ClientError::Stream { code, .. } => Some(code),
            _ => None,
        }
    }

    /// The daemon's error message.
    pub fn message(&self) -> Option<&str> {
        match self {
            ClientError::Api { message, .. } | ClientError::Stream { message, .. } => Some(message),
            _ => None,
        }
    }

    /// The call that failed: (method, path).
    pub fn call(&self) -> Option<(&str, &str)> {
        match self {
            ClientError::Connect { method, path, .. }
            | ClientError::Http { method, path, .. }
            | ClientError::Timeout { method, path, .. }
            | ClientError::Api { method, path, .. }
            | ClientError::Stream { method, path, .. }
            | ClientError::TooLarge { method, path, .. }
            | ClientError::Protocol { method, path, .. }
            | ClientError::Sse { method, path, .. } => Some((method, path)),
            ClientError::InvalidUrl { .. } | ClientError::InvalidRequest(_) => None,
        }
    }

    /// The daemon refused for lack of room (503: its sandbox cap, or no
    /// memory/CPU left on the host).
    pub fn is_capacity(&self) -> bool {
        self.status() == Some(503)
    }

    /// 404, or 410 `sandbox_lost` (a sandbox stopped because its host was
    /// lost): either way it is not there any more, and a caller that
    /// recovers from a missing sandbox (a session resuming from its
    /// checkpoint) must do the same for a lost one.
    pub fn is_not_found(&self) -> bool {
        matches!(self.status(), Some(404 | 410))
    }

    /// 410 `sandbox_lost`: its host was lost (the message says when).
    pub fn is_lost(&self) -> bool {
        self.status() == Some(410)
    }

    pub fn is_unauthorized(&self) -> bool {
        self.status() == Some(401)
    }

    pub fn is_conflict(&self) -> bool {
        self.status() == Some(409)
    }

    pub fn is_too_large(&self) -> bool {
        self.status() == Some(413)
    }

    pub fn is_rate_limited(&self) -> bool {
        self.status() == Some(429)
    }

    /// A 4xx: the request itself was wrong (or named something gone).
    pub fn is_client_error(&self) -> bool {
        matches!(self.status(), Some(400..=499)) || matches!(self, ClientError::InvalidRequest(_))
    }

    /// The daemon could not be reached or the connection broke: worth a
    /// retry later, nothing was answered.
    pub fn is_transport(&self) -> bool {
        matches!(
            self,
            ClientError::Connect { .. } | ClientError::Http { .. } | ClientError::Timeout { .. }
        )
    }

    pub fn is_timeout(&self) -> bool {
        matches!(self, ClientError::Timeout { .. })
    }
}

pub type Result<T, E = ClientError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    fn api(status: u16, code: &str) -> ClientError {
        ClientError::Api {
            method: "POST".into(),
            path: "/v1/sandboxes".into(),
            status,
            code: code.into(),
            message: "no room".into(),
        }
    }

    #[test]
    fn helpers() {
        let e = api(503, "capacity");
        assert!(e.is_capacity() && !e.is_not_found() && !e.is_client_error());
        assert_eq!(e.code(), Some("capacity"));
        assert_eq!(e.call(), Some(("POST", "/v1/sandboxes")));
        assert_eq!(e.to_string(), "POST /v1/sandboxes: 503 capacity: no room");
        assert!(api(404, "not_found").is_not_found());
        let lost = api(410, "sandbox_lost");
        assert!(lost.is_not_found() && lost.is_lost() && !api(404, "x").is_lost());
        assert!(api(413, "too_large").is_too_large());
        assert!(api(429, "too_many").is_rate_limited());
        assert!(api(409, "conflict").is_client_error());
        let t = ClientError::Timeout {
            method: "GET".into(),
            path: "/healthz".into(),
            after: Duration::from_secs(1),
        };
        assert!(t.is_transport() && t.is_timeout() && t.status().is_none());
    }
}
