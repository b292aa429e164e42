//! gVisor runtime. Each sandbox is one `runsc` container whose init is the
//! guest agent. A small per-sandbox shim process (`hatchery-shim`, in the
//! spirit of containerd's shims) starts `runsc run`, owns the agent's stdio
//! pipes, relays them to a unix socket, and destroys the sandbox by itself
//! when its TTL passes. Because the shim, not the daemon, holds the pipes and
//! the deadline, sandboxes keep their channel and their TTL across a daemon
//! crash, and a restarted daemon simply reconnects.
//!
//! On-disk layout under the runtime's state directory:
//! ```text
//! runsc/                 runsc --root (container state)
//! sandboxes/<id>/        bundle: config.json, shim.json, shim.sock, logs
//! ```

mod files;
pub mod freezer;
mod layout;
pub mod memcg;
mod oci;
pub mod oom;
mod oom_count;
mod runtime;
pub mod shim;
pub mod teardown;

pub use layout::{GvisorConfig, Layout};
pub use runtime::GvisorRuntime;
