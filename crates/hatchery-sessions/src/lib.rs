//! Agent sessions: a coding agent working on a repository in a sandbox.
//! The crate holds the sessions API (`/v1/sessions`), the typed lifecycle,
//! the ordered event log with its SSE fan-out, the store trait (SQLite
//! now), the scheduler interface, and the runner that drives each session
//! through a sandbox it uses via the narrow [`sandbox::Sandboxes`] trait.

pub mod agent_proto;
pub mod api_state;
mod auth;
mod broker_access;
pub mod broker_events;
pub mod broker_hooks;
pub mod bus;
pub mod caps;
pub mod client_sandboxes;
pub mod config;
pub mod egress;
pub mod environment_routes;
#[cfg(test)]
mod environment_tests;
pub mod environments;
pub mod error;
pub mod events;
mod extract;
pub mod git_cred;
pub mod guest_trust;
pub mod handoff;
pub mod held_approvals;
pub mod hooks;
mod host_reports;
pub mod ids;
pub mod layout;
pub mod metrics;
pub mod model_events;
pub mod models;
pub mod openapi;
pub mod owner_post;
pub mod policy;
pub mod policy_move;
pub mod replay;
pub mod repo;
pub mod routes;
mod runner;
#[cfg(test)]
mod runner_tests;
pub mod sandbox;
pub mod scheduler;
pub mod service;
mod session_core;
pub mod state;
pub mod store;
pub mod tenant_usage;
pub mod validate;

pub use config::{SessionArgs, SessionsConfig};
pub use routes::router;
pub use service::Sessions;
