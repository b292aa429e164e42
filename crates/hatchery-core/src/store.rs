//! The state store lives in `hatchery-store` (SQLite or PostgreSQL behind
//! one async trait); this module names what the core uses of it.

pub use hatchery_store::{
    host_resource, Event, Fence, Lease, SandboxFilter, SandboxRow, SandboxState, SnapshotKind,
    SnapshotLocation, SnapshotRow, Store, StoreError,
};
