//! Policies for agent tool calls and egress: versioned, ordered rules
//! (match → allow | deny | require_approval), first match wins, default
//! deny. One evaluator shared by the broker and the egress proxy.
//!
//! - [`document`]: the JSON format callers write.
//! - [`compile`]: validation, with errors that name the rule.
//! - [`eval`]: the evaluator (allocation-free, microseconds).
//! - [`store`] / [`sqlite_store`] / [`pg_store`]: immutable versions behind
//!   an async trait, on SQLite (one host) or PostgreSQL (many hosts);
//!   [`conformance`] holds both to one contract.
//! - [`http`]: the `/v1/policies` router; [`openapi`]: its document.
//!
//! docs/policy.md describes the format and `pol_standard`.

pub mod cache;
pub mod compile;
pub mod conformance;
pub mod document;
pub mod eval;
mod glob;
pub mod http;
pub mod openapi;
pub mod pg_store;
mod record;
pub mod sqlite_store;
pub mod standard;
pub mod store;

pub use compile::{Policy, ValidationError};
pub use document::{Effect, PolicyDocument};
pub use eval::{Decision, Destination, Request, EGRESS_TOOL};
pub use pg_store::PgPolicyStore;
pub use record::{MAX_POLICIES, MAX_VERSIONS};
pub use sqlite_store::SqlitePolicyStore;
pub use store::{PolicyStore, StoreError, StoredPolicy};
