//! Egress that waits for a person (docs/sessions.md, "Egress approvals"):
//! a connection a `require_approval` rule decides is held, before anything
//! is dialled, while an [`Approver`] asks and waits for a decision. For an
//! intercepted destination (a credential rule names it, so the proxy sees
//! each request) the question is asked per request instead: each request
//! is held, before it goes upstream, with its method and path. The proxy
//! only holds and acts on the answer; asking, recording and remembering
//! are the approver's (sessions implement it over the session's log and
//! its decision endpoint), keyed by [`DecisionKey`].

use crate::events::{SessionId, SourceError};
use std::time::Duration;

/// One held connection's question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalAsk {
    pub session: SessionId,
    /// The destination as the guest named it (normalised) and its port.
    pub host: String,
    pub port: u16,
    /// The request's method and path (without its query), when the proxy
    /// has them: a forwarded plain-HTTP request, or a request on an
    /// intercepted connection. A tunnelled CONNECT is asked for before
    /// anything reaches the destination, so by host and port only.
    pub method: Option<String>,
    pub path: Option<String>,
    /// Asked per request (an intercepted destination): the decision, and
    /// a remembered one, cover this method and exact path only. Otherwise
    /// the connection's host and port (a forwarded plain request is one
    /// connection; its method and path are shown, not part of the key).
    pub per_request: bool,
    /// The `require_approval` rule that decided, and the policy version.
    pub rule_id: String,
    pub policy_version: Option<u32>,
    /// The rule's hold limit: the approver answers [`Answer::TimedOut`]
    /// once it has passed without a decision.
    pub timeout: Duration,
}

/// What a decision covers, and what a remembered one is looked up by:
/// host and port, plus for a per-request ask the method and the exact
/// path (without query). Exact rather than a prefix: approving
/// `GET /v1/models` says nothing about `GET /v1/models/../admin` or
/// `/v1/models-delete`, and a person sees exactly what they allow.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DecisionKey {
    pub host: String,
    pub port: u16,
    /// `(method, path)` for a per-request decision.
    pub request: Option<(String, String)>,
}

impl DecisionKey {
    /// The key from its parts; the path loses its query and fragment
    /// (they are neither shown nor remembered).
    pub fn new(host: &str, port: u16, request: Option<(&str, &str)>) -> Self {
        DecisionKey {
            host: host.to_string(),
            port,
            request: request.map(|(m, p)| (m.to_string(), strip_query(p).to_string())),
        }
    }
}

/// A request target's path without its query or fragment.
pub fn strip_query(target: &str) -> &str {
    target.split(['?', '#']).next().unwrap_or("")
}

impl ApprovalAsk {
    pub fn key(&self) -> DecisionKey {
        let request = match (self.per_request, &self.method, &self.path) {
            (true, Some(m), Some(p)) => Some((m.as_str(), p.as_str())),
            _ => None,
        };
        DecisionKey::new(&self.host, self.port, request)
    }
}

/// What became of a question. Each one is in the session's log before
/// the approver returns it, so the connection goes on (or not) only after
/// its record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// A person approved (`approval_id`), or an earlier approval with
    /// `remember: "session"` covers this destination (`remembered`).
    Approved {
        approval_id: String,
        remembered: bool,
    },
    Denied {
        approval_id: String,
        note: String,
    },
    /// No decision within the rule's hold limit.
    TimedOut {
        approval_id: String,
    },
}

/// A question's answer that lets nothing through: the status the guest
/// gets, why, and the approval it names (none when it could not be asked).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Refused {
    pub status: u16,
    pub why: String,
    pub approval_id: Option<String>,
}

/// An answer as the proxy acts on it, for a connection and a request
/// alike: `Ok((approval_id, remembered))` lets it through; otherwise the
/// refusal (403 denied or timed out, 503 when it could not be asked).
pub(crate) fn decided(
    answer: Result<Answer, SourceError>,
    timeout: Duration,
    rule_id: &str,
) -> Result<(String, bool), Refused> {
    match answer {
        Ok(Answer::Approved {
            approval_id,
            remembered,
        }) => Ok((approval_id, remembered)),
        Ok(Answer::Denied { approval_id, note }) => Err(Refused {
            status: 403,
            why: if note.is_empty() {
                format!("denied by approval {approval_id}")
            } else {
                format!("denied by approval {approval_id}: {note}")
            },
            approval_id: Some(approval_id),
        }),
        Ok(Answer::TimedOut { approval_id }) => Err(Refused {
            status: 403,
            why: format!(
                "approval {approval_id} not decided within {} s (rule {rule_id:?})",
                timeout.as_secs()
            ),
            approval_id: Some(approval_id),
        }),
        Err(e) => Err(Refused {
            status: 503,
            why: format!(
                "the approval could not be asked: {}",
                hatchery_serve::error_text::with_causes(&*e)
            ),
            approval_id: None,
        }),
    }
}

/// Asks for a decision on a held connection and waits for it (at most
/// the ask's timeout, plus the time to record the timeout). An error
/// refuses the connection (503).
#[async_trait::async_trait]
pub trait Approver: Send + Sync + 'static {
    async fn ask(&self, ask: ApprovalAsk) -> Result<Answer, SourceError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(per_request: bool, method: Option<&str>, path: Option<&str>) -> ApprovalAsk {
        ApprovalAsk {
            session: "s".into(),
            host: "api.example".into(),
            port: 443,
            method: method.map(str::to_string),
            path: path.map(str::to_string),
            per_request,
            rule_id: "r".into(),
            policy_version: None,
            timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn a_per_request_decision_covers_its_method_and_exact_path() {
        let k = ask(true, Some("GET"), Some("/v1/models")).key();
        assert_eq!(
            k,
            DecisionKey::new("api.example", 443, Some(("GET", "/v1/models")))
        );
        // The query is not part of it.
        assert_eq!(ask(true, Some("GET"), Some("/v1/models?x=1")).key(), k);
        assert_eq!(ask(true, Some("GET"), Some("/v1/models#f")).key(), k);
        // Another path, a longer one, a trailing slash, another method.
        for (m, p) in [
            ("GET", "/v1/other"),
            ("GET", "/v1/models/1"),
            ("GET", "/v1/models/"),
            ("GET", "/v1/models-x"),
            ("GET", "/v1/models/../admin"),
            ("GET", "/v1/Models"),
            ("POST", "/v1/models"),
        ] {
            assert_ne!(ask(true, Some(m), Some(p)).key(), k, "{m} {p}");
        }
        // Another host or port.
        let mut other = ask(true, Some("GET"), Some("/v1/models"));
        other.port = 8443;
        assert_ne!(other.key(), k);
        other.port = 443;
        other.host = "api.example.org".into();
        assert_ne!(other.key(), k);
    }

    #[test]
    fn a_connection_decision_is_by_host_and_port_only() {
        let conn = ask(false, None, None).key();
        assert_eq!(conn, DecisionKey::new("api.example", 443, None));
        // A forwarded plain request shows its method and path, but its
        // decision is the connection's.
        assert_eq!(ask(false, Some("GET"), Some("/plain")).key(), conn);
        // A per-request decision never covers the connection, nor the
        // other way round.
        assert_ne!(ask(true, Some("GET"), Some("/plain")).key(), conn);
        // Per request without the request (never built so) is by
        // connection rather than by a made-up path.
        assert_eq!(ask(true, None, None).key(), conn);
    }
}
