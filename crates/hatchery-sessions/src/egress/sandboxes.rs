//! Sandboxes that use the egress proxy without a session: E2B sandboxes
//! created with header transforms (`network.rules`, docs/e2b.md). Each is
//! bound with a policy of its own (compiled by the caller from the
//! sandbox's egress options and header bindings), and its connections go
//! under the pseudo-session `sandbox:<id>`, which no session id can be
//! (session ids are `ses_…`).
//!
//! There is no session log to write to, so these connections' events go
//! to the daemon's log ([`Routed`]): every intent and every credential use
//! is written there before the dial or the request, as a session's are to
//! its hash-chained log; refusals are rate-limited.

use super::events::SessionEvents;
use hatchery_egress::{
    CredentialResult, CredentialUse, EgressEvent, EgressResult, Events, SourceError,
};
use hatchery_serve::limited_warn;
use hatchery_serve::log_limit::LogLimiter;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// The pseudo-session a sessionless sandbox's connections go under.
pub const SANDBOX_PREFIX: &str = "sandbox:";

/// The pseudo-session of `sandbox`.
pub fn pseudo_session(sandbox: &str) -> String {
    format!("{SANDBOX_PREFIX}{sandbox}")
}

/// The sandbox a pseudo-session names; `None` for a real session.
pub fn sandbox_of(session: &str) -> Option<&str> {
    session.strip_prefix(SANDBOX_PREFIX)
}

fn limiter() -> &'static LogLimiter {
    static L: OnceLock<LogLimiter> = OnceLock::new();
    L.get_or_init(|| LogLimiter::new(Duration::from_secs(10), 5))
}

/// Sessions' events to their logs, sessionless sandboxes' to the
/// daemon's log.
pub struct Routed {
    pub sessions: Arc<SessionEvents>,
    /// Ids handed back for intents and credential uses (the daemon log's
    /// lines carry them, so a result names what it ends).
    seq: AtomicU64,
}

impl Routed {
    pub fn new(sessions: Arc<SessionEvents>) -> Self {
        Routed {
            sessions,
            seq: AtomicU64::new(1),
        }
    }

    fn next(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed)
    }
}

/// The sandbox a connection's session names, if it is a pseudo-session
/// (owned, so the event can be handed on when it is not).
fn sandbox_in(session: Option<&str>) -> Option<String> {
    session.and_then(sandbox_of).map(str::to_string)
}

#[async_trait::async_trait]
impl Events for Routed {
    async fn connect(&self, e: EgressEvent) -> Result<u64, SourceError> {
        let Some(sbx) = sandbox_in(e.session.as_deref()) else {
            return self.sessions.connect(e).await;
        };
        let seq = self.next();
        tracing::info!(target: "hatchery::egress::sandbox", sandbox = %sbx, seq,
            host = e.host.as_deref().unwrap_or(""), port = e.port.unwrap_or(0),
            ip = ?e.ip, rule = e.rule_id.as_deref().unwrap_or(""), "egress connect");
        Ok(seq)
    }

    async fn result(&self, r: EgressResult) {
        let Some(sbx) = sandbox_in(Some(&r.session)) else {
            return self.sessions.result(r).await;
        };
        tracing::info!(target: "hatchery::egress::sandbox", sandbox = %sbx, connect_seq = r.intent,
            outcome = r.outcome.as_str(), status = r.status, bytes_up = r.bytes_up,
            bytes_down = r.bytes_down, duration_ms = r.duration.as_millis() as u64, "egress result");
    }

    fn denied(&self, e: EgressEvent) {
        let Some(sbx) = sandbox_in(e.session.as_deref()) else {
            return self.sessions.denied(e);
        };
        // A guest can refuse itself at will: at most a few lines a window.
        limited_warn!(limiter(), "egress-sandbox-denied", sandbox = %sbx,
            host = e.host.as_deref().unwrap_or(""), port = e.port.unwrap_or(0),
            status = e.status, reason = %e.reason, "egress refused");
    }

    async fn credential(&self, u: CredentialUse) -> Result<u64, SourceError> {
        let Some(sbx) = sandbox_in(Some(&u.session)) else {
            return self.sessions.credential(u).await;
        };
        let seq = self.next();
        // Never the value: the secret's name, where and what.
        tracing::info!(target: "hatchery::egress::sandbox", sandbox = %sbx, seq,
            connect_seq = u.connect_seq, secret = %u.secret, rule = %u.rule_id, host = %u.host,
            port = u.port, method = %u.method, path = %u.path, "egress credential added");
        Ok(seq)
    }

    async fn credential_result(&self, r: CredentialResult) {
        let Some(sbx) = sandbox_in(Some(&r.session)) else {
            return self.sessions.credential_result(r).await;
        };
        tracing::info!(target: "hatchery::egress::sandbox", sandbox = %sbx, use_seq = r.use_seq,
            status = r.status, reason = %r.reason, "egress credential answer");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pseudo_sessions_name_their_sandbox_and_never_a_session() {
        let s = pseudo_session("sbx_abc");
        assert_eq!(sandbox_of(&s), Some("sbx_abc"));
        assert_eq!(sandbox_of("ses_0123456789abcdef"), None);
    }
}
