//! The egress proxy: HTTP CONNECT and plain-HTTP forward, each connection
//! checked against its session's pinned policy at connection time.
//! docs/policy.md, "Egress proxy".

pub mod addr;
pub mod metrics;
pub mod proxy;
pub mod target;

pub use proxy::{
    EgressEvent, EgressResult, EventSink, Events, Identify, Limits, Outcome, PolicySource, Proxy,
    SessionId, SessionPolicy, SourceError, Verdict,
};
