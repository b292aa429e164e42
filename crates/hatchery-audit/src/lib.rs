//! Hash-chained audit events. Each event's hash is
//! SHA-256(prev_hash || canonical_json(event)) within its chain; [`verify`]
//! walks any store's events and names the first bad seq; [`anchor`] writes
//! chain heads to [`sink`]s outside the database (an append-only file, an
//! external hook, an S3-compatible object store, [`s3`]) so a
//! consistently rewritten database is caught too. [`store`] is a SQLite
//! audit log with a documented table layout (what `hatchery audit verify`
//! reads from a file that has it; the session logs are read by
//! hatchery-sessions-schema's reader). docs/policy.md, "Audit", has the rules.

pub mod anchor;
pub mod canonical;
pub mod event;
pub mod line;
pub mod s3;
pub mod sink;
pub mod store;
pub mod verify;

pub use anchor::{read_anchors, Anchor, AnchorMetrics};
pub use canonical::canonical_json;
pub use event::{Event, Hash, StoredEvent, GENESIS};
pub use store::{AuditError, SqliteAuditLog};
pub use verify::{verify, BadEvent, Head, Problem, Report};
