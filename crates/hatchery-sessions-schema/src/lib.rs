//! The sessions' PostgreSQL schema, and the read-only reader `hatchery
//! audit verify` uses on it. A crate of its own so that the CLI reads the
//! logs many hosts share without linking the sessions service (its HTTP
//! API, runner and their dependencies).

pub mod audit;
pub mod migrations;

pub use audit::{AuditReadError, PgAuditReader};
pub use migrations::SCHEMA;
