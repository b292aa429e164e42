//! The core: sandbox lifecycle and state, independent of HTTP and of the
//! isolation technology. The API crate calls [`Manager`]; the manager calls a
//! [`hatchery_runtime::Runtime`] and talks to each guest agent through an
//! [`agent_client::AgentClient`].

pub mod agent_client;
pub mod builds;
mod caps;
pub mod code;
mod ends;
mod error;
pub mod exec;
pub mod files;
pub mod host_services;
mod idle;
mod idle_gate;
#[cfg(test)]
mod idle_tests;
mod ids;
pub mod lease;
mod manager;
#[cfg(test)]
mod manager_tests;
pub mod metrics;
pub(crate) mod network;
pub mod pool;
pub mod preview;
mod proc_oom;
pub mod procs;
pub mod proxy;
pub mod pty;
pub mod ratelimit;
// Sandbox-triggered warnings, rate-limited (hatchery-serve has the one copy).
pub use hatchery_serve::limited_warn;
#[doc(hidden)]
mod reaper;
pub mod reconcile;
pub mod relay;
mod relay_credit;
pub mod snapshot_pool;
mod snapshot_stores;
pub mod snapshots;
pub mod start_builds;
mod steps;
pub mod store;
mod template_images;
mod time_util;

pub use caps::{within, Caps};
pub use error::CoreError;
pub use hatchery_net::{EgressEvent, Policy as NetworkPolicy};
pub use host_services::{HostAddr, HostService, HostServiceError, Identity};
pub use ids::{new_sandbox_id, valid_sandbox_id};
pub use manager::{CreateRequest, ImageConfig, Manager, SandboxInfo};
pub use pool::PoolConfig;
pub use preview::{PreviewError, PreviewGrant, PreviewKey};
pub use relay::RelayStream;
pub use snapshot_pool::SnapshotPoolInfo;
pub use snapshots::{ForkRequest, SnapshotInfo};
pub use time_util::{now_ms, rfc3339};
