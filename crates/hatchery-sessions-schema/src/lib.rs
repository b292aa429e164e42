//! The sessions' schema, and the read-only reader `hatchery audit verify`
//! uses on it. A crate of its own so that the CLI reads the logs without
//! linking the sessions service (its HTTP API, runner and their
//! dependencies).

pub mod store;

pub use store::audit::{AuditReadError, AuditReader};
pub use store::schema::SCHEMA;
