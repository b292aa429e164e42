//! The egress proxy: HTTP CONNECT and plain-HTTP forward, each connection
//! checked against its session's pinned policy at connection time.
//! docs/policy.md, "Egress proxy".

pub mod addr;
pub mod approval;
mod dial;
pub mod events;
pub mod intercept;
pub mod metrics;
pub mod proxy;
pub mod target;

pub use approval::{Answer, ApprovalAsk, Approver, DecisionKey};
pub use intercept::{CredentialResult, CredentialSource, CredentialUse, Interception};
pub use proxy::{
    EgressEvent, EgressResult, EventSink, Events, Identify, Limits, Outcome, PolicySource, Proxy,
    SessionId, SessionPolicy, SourceError, Verdict,
};
/// Secret values are handed to the proxy in this (zeroed when dropped).
pub use zeroize::Zeroizing;
