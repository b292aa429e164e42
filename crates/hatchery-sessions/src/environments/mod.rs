//! Environments: a repository's set-up done once. An environment names a
//! repository, a base ref, a template and a set-up script with an egress
//! policy of its own; a build creates a sandbox from the template, fetches
//! the repository on the host (the credential never enters the sandbox),
//! runs the set-up with its egress, closes that egress and snapshots the
//! result as a new immutable version. Sessions created with
//! `environment_id` fork that snapshot and get only the files that changed
//! between the version's base commit and their own ref (runner.rs).
//!
//! A module of hatchery-sessions rather than a crate: it uses the same
//! sandbox trait, host-side fetch, database and API key as the sessions,
//! and its delete checks the sessions' own table. Its routes are in
//! `environment_routes.rs`, its tests with the runner's in
//! `environment_tests.rs`: outside this module, so that the sessions'
//! modules it is used by are never imported back.

pub mod build;
pub mod error;
pub mod models;
pub mod pool;
pub mod progress;
pub mod service;
pub mod store;

pub use error::EnvError;
pub use service::Environments;
