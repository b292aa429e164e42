//! The tool broker of agent sessions. A sandbox reaches it only through
//! its `broker` host service (so the host attaches the sandbox's
//! identity); each call `(session, seq, tool, args)` is decided by the
//! session's pinned policy, recorded before its effect, run at most once
//! with a credential only the host holds, and answered from the record on
//! every retry. docs/sessions.md, "Tool broker", has the wire shape.

pub mod caps;
pub mod catalog;
pub mod config;
mod cut;
pub mod diffstat;
pub mod embed;
pub mod error;
pub mod fetch;
pub mod git;
pub mod github;
pub mod http_client;
pub mod mcp;
mod mcp_error;
pub mod mcp_http;
mod mcp_listen;
mod mcp_rpc;
pub mod mcp_stdio;
pub mod metrics;
pub mod relay;
pub mod routes;
pub mod runner;
pub mod sandbox;
pub mod service;
#[cfg(test)]
mod service_tests;
pub mod session_log;
pub mod store;
pub mod tree;
pub mod wire;

pub use config::{BrokerArgs, BrokerConfig};
pub use service::Broker;
