//! Templates and snapshots: everything a sandbox is started from.
//!
//! - a template is a spec (packages, files, setup commands, fixed resource
//!   shape), a Debian root filesystem built from it, and, once the daemon
//!   has baked it, a warm checkpoint that every create restores;
//! - a snapshot is a sealed checkpoint of a running sandbox, which forks
//!   restore.
//!
//! Both kinds of checkpoint live in an [`ImageStore`]; snapshots go through
//! a [`SnapshotStore`] (the local directory, or one every host mounts).

mod build;
mod images;
pub mod snapshot_store;
mod spec;
mod spec_file;
mod store;
mod verified;

pub use build::{build_rootfs, default_mirror, BuildPriority};
pub use images::{ImageError, ImageStore, SealedImage};
pub use snapshot_store::{SnapshotStore, SnapshotStoreError, SnapshotStoreKind, SnapshotStoreSpec};
pub use spec::{valid_name, TemplateSpec, BASE_BOOKWORM, BASE_PACKAGES};
pub use spec_file::{SpecFile, SpecFileError};
pub use store::{Template, Templates};

pub const DEFAULT_TEMPLATE: &str = "code-interpreter";

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("template '{0}' not found")]
    NotFound(String),
    #[error("invalid template name '{0}': use 1-64 of [a-z0-9-]")]
    InvalidName(String),
    #[error("invalid template spec: {0}")]
    Invalid(String),
    #[error("template '{name}' is broken: {why}")]
    Broken { name: String, why: String },
    #[error("template build failed: {0}")]
    Build(String),
    #[error("template store: {0}")]
    Io(String),
}
