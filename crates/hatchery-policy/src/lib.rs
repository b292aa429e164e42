//! Policies for agent tool calls and egress: versioned, ordered rules
//! (match → allow | deny | require_approval), first match wins, default
//! deny. One evaluator shared by the broker and the egress proxy.
//!
//! - [`document`]: the JSON format callers write.
//! - [`compile`]: validation, with errors that name the rule.
//! - [`eval`]: the evaluator (allocation-free, microseconds).
//! - [`store`]: immutable versions behind an async trait, kept in the
//!   deployment's one database ([`DbPolicyStore`], SQLite or PostgreSQL);
//!   [`store::conformance`] is its contract.
//! - [`http`]: the `/v1/policies` router; [`openapi`]: its document.
//! - [`secret_scope`]: which secrets no stored policy binds (an E2B
//!   sandbox's own); a policy's names are its owner's (http.rs).
//!
//! docs/policy.md describes the format and `pol_standard`.

pub mod binding;
pub mod cache;
pub mod compile;
pub mod document;
pub mod eval;
mod glob;
pub mod http;
pub mod openapi;
pub mod secret_scope;
pub mod standard;
pub mod store;

pub use binding::{CredentialBinding, Injection, Scheme};
pub use compile::credential::{self, Credential};
pub use compile::{Policy, ValidationError};
pub use document::{Effect, PolicyDocument};
pub use eval::{
    Decision, Destination, Request, EGRESS_TOOL, MODEL_CALL_TOOL, REPLAY_DIVERGED_TOOL,
};
pub use store::{DbPolicyStore, PolicyStore, StoreError, StoredPolicy, MAX_POLICIES, MAX_VERSIONS};
