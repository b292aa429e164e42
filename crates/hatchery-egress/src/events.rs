//! What the proxy reports and the bounds it keeps: the events of a
//! connection (its intent before the dial, its result, refusals,
//! credential uses), the sink they go to, and the limits. Apart from the
//! proxy and the interception so both can use them.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

pub type SessionId = String;

/// Why a policy lookup or an allowed connection's event failed: the
/// implementation's own error (its text, causes included, goes into the
/// refusal the guest reads and the denial event).
pub type SourceError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Allowed,
    Denied,
}

/// A connection the policy allowed (its intent, before the dial) or one
/// refused before any dial.
#[derive(Debug, Clone)]
pub struct EgressEvent {
    pub verdict: Verdict,
    pub session: Option<SessionId>,
    pub peer: SocketAddr,
    pub host: Option<String>,
    pub port: Option<u16>,
    /// The address dialled (allowed) or the last one considered (denied).
    pub ip: Option<IpAddr>,
    pub rule_id: Option<String>,
    /// HTTP status answered to the client (200 for an intent).
    pub status: u16,
    pub reason: String,
    /// The policy version that decided ([`SessionPolicy::version`]); none
    /// when the decision came before a policy was at hand.
    pub policy_version: Option<u32>,
    /// The approval that decided a held connection (approved, denied or
    /// timed out; [`crate::Approver`]).
    pub approval_id: Option<String>,
}

/// How an allowed connection ended, after its intent was recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The destination answered the dial; bytes and duration are the
    /// tunnel's when it closed.
    Connected,
    /// The destination refused the dial (connection refused).
    Refused,
    /// The dial timed out or failed otherwise.
    Failed,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Connected => "connected",
            Outcome::Refused => "refused",
            Outcome::Failed => "failed",
        }
    }
}

/// The outcome of one recorded intent.
#[derive(Debug, Clone)]
pub struct EgressResult {
    pub session: SessionId,
    /// What [`Events::connect`] returned for the intent this ends.
    pub intent: u64,
    pub outcome: Outcome,
    /// HTTP status answered to the client (200 when connected).
    pub status: u16,
    pub reason: String,
    /// Bytes relayed to the destination and back (0 unless connected).
    pub bytes_up: u64,
    pub bytes_down: u64,
    /// From the intent being recorded to the tunnel closing (or the dial
    /// failing).
    pub duration: Duration,
}

/// Where the proxy's connection events go.
#[async_trait::async_trait]
pub trait Events: Send + Sync {
    /// The intent to dial an allowed destination, awaited before the dial:
    /// `Ok` means it is durable (its id is handed back in the result); an
    /// error refuses the connection, so nothing is dialled unrecorded.
    async fn connect(&self, e: EgressEvent) -> Result<u64, SourceError>;
    /// How a recorded intent ended: awaited by the connection's own task
    /// once it is over, so it delays nothing the guest waits for.
    async fn result(&self, r: EgressResult);
    /// A refusal. Must not block the proxy (a guest can make many).
    fn denied(&self, e: EgressEvent);
    /// A credential about to be added to a request, awaited before the
    /// request goes out: `Ok` (the use's id) means it is durable; an error
    /// refuses the request (503), so no secret goes out unrecorded. A sink
    /// that does not record uses refuses them all.
    async fn credential(&self, _u: CredentialUse) -> Result<u64, SourceError> {
        Err("this event sink does not record credential use".into())
    }
    /// The destination's answer to a request that carried a credential.
    async fn credential_result(&self, _r: CredentialResult) {}
}

/// A plain function takes intents and refusals, never refuses, and does
/// not see results (tests, benches).
#[async_trait::async_trait]
impl<F: Fn(EgressEvent) + Send + Sync> Events for F {
    async fn connect(&self, e: EgressEvent) -> Result<u64, SourceError> {
        self(e);
        Ok(0)
    }
    async fn result(&self, _: EgressResult) {}
    fn denied(&self, e: EgressEvent) {
        self(e)
    }
}

pub type EventSink = Arc<dyn Events>;

#[derive(Debug, Clone)]
pub struct Limits {
    pub max_tunnels: usize,
    pub max_tunnels_per_session: usize,
    /// A tunnel with no bytes either way for this long is closed.
    pub idle: Duration,
    /// The whole request head must arrive within this.
    pub head_timeout: Duration,
    pub max_head_bytes: usize,
    pub resolve_timeout: Duration,
    pub connect_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_tunnels: 1024,
            max_tunnels_per_session: 64,
            idle: Duration::from_secs(300),
            head_timeout: Duration::from_secs(10),
            max_head_bytes: 16 * 1024,
            resolve_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// A credential about to go out in one request (recorded before it does).
/// Never the value.
#[derive(Debug, Clone)]
pub struct CredentialUse {
    pub session: SessionId,
    /// The seq of the connection's `egress_connect`.
    pub connect_seq: u64,
    pub rule_id: String,
    pub secret: String,
    pub host: String,
    pub port: u16,
    pub method: String,
    /// The request path without its query (a query may carry the secret).
    pub path: String,
    pub policy_version: Option<u32>,
}

/// The destination's answer to a request that carried a credential.
#[derive(Debug, Clone)]
pub struct CredentialResult {
    pub session: SessionId,
    /// What [`crate::Events::credential`] returned for its use.
    pub use_seq: u64,
    /// The destination's status, or the one the proxy answered (502) when
    /// the destination gave none.
    pub status: u16,
    pub reason: String,
}
