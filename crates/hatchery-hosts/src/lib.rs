//! Operating many hosts on one shared state store (a `postgres://` --db):
//! answering hatchery-route's directory questions (who owns a sandbox, a
//! snapshot, a session; which hosts are alive and how full: [`directory`])
//! and sweeping lost hosts (fence them, stop their rows with `host_lost`,
//! take their sessions over: [`sweeper`]).
//!
//! A host that is drained or told to stop moves its sessions to another
//! host at once ([`shedding`], [`graceful_stop`], [`handoff_targets`]).
//!
//! It also serves the operator's view of them: `GET /v1/hosts`, cordon,
//! uncordon and drain ([`api`]), every role's `/readyz` ([`readiness`]),
//! the hosts' gauges ([`gauges`]), and a held host's refusal of creates
//! ([`hold_guard`]).
//!
//! Trusts: the shared store, its rows and the database's clock, by which
//! a heartbeat's age is measured (no host's own clock decides whether
//! another host is alive). What runs on this host and the sessions it
//! takes over come through the narrow traits in [`local`] and
//! [`takeover`], each with a fake for the tests.

pub mod api;
pub mod api_error;
pub mod directory;
pub mod gauges;
pub mod graceful_stop;
pub mod handoff_targets;
pub mod hold_guard;
pub mod local;
pub mod openapi;
pub mod readiness;
pub mod sessions_count;
pub mod shedding;
pub mod sweeper;
pub mod takeover;
pub mod view;

pub use directory::StoreDirectory;
pub use local::LocalSandboxes;
pub use takeover::SessionTakeover;

/// Whether a host is alive: its last heartbeat, by the database's clock,
/// is within the host lease TTL.
pub fn alive(silent_for_ms: u64, lease_ttl_ms: u64) -> bool {
    silent_for_ms <= lease_ttl_ms
}

#[cfg(test)]
mod tests;
