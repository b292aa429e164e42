//! Routing across hosts that share one state store.
//!
//! - [`layer`]: an axum middleware for a host's API. A request scoped to
//!   a sandbox or snapshot (`/v1/sandboxes/{id}/...`, `/v1/snapshots/{id}/...`)
//!   that this host does not own is forwarded to the owner's advertised
//!   URL ([`forward`]: streaming bodies, WebSocket upgrades spliced), or
//!   answered 503 with Retry-After when the owner is lost or unreachable.
//!   Never handled locally as if the sandbox were unknown.
//! - [`control`]: the router of the `control` role: no runtime; creates are
//!   placed by [`placement`] (a warm checkpoint of the template first, then
//!   the fewest of the tenant's sandboxes, then the most free capacity; a
//!   full host skipped),
//!   everything sandbox-scoped goes to the owner, the rest to any live host;
//!   a snapshot in the shared store has no owner: its fork is placed like
//!   a create.
//!
//! Where a sandbox lives is asked through the narrow [`Directory`] trait,
//! so this crate knows neither the store nor the manager.

pub mod control;
mod error;
pub mod fake;
pub mod forward;
pub mod layer;
mod metrics;
pub mod placement;
pub mod relay;
mod target;

pub use error::RouteError;
pub use metrics::RouteMetrics;
pub use target::{scope_of, scope_of_request, Scope};

use async_trait::async_trait;
use std::collections::BTreeMap;

/// Marks a forwarded request with the forwarding host's id: the receiver
/// handles it itself, so a request is forwarded at most once (no loops
/// while two hosts disagree about an owner).
pub const FORWARDED_BY: &str = "x-hatchery-forwarded-by";

/// Where a sandbox or snapshot is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// On this host, or nowhere (the local handler answers 404).
    Here,
    /// On another live host, at its advertised internal URL.
    At { host: String, url: String },
    /// Owned by a host that missed its heartbeats past the lease TTL.
    Lost { host: String },
    /// Owned by a host that is alive but has not yet reconciled and
    /// listened (503 with Retry-After until it is ready).
    Starting { host: String },
    /// A sandbox that was stopped because its host was lost: answered
    /// 410 `sandbox_lost` (when and why) for as long as its row is kept.
    Gone {
        host: String,
        at_ms: u64,
        reason: String,
    },
    /// Servable by any host that mounts the shared snapshot store (a
    /// shared snapshot, asked by the control role, which mounts nothing):
    /// a fork is placed like a create, anything else goes to a live host.
    Anywhere,
    /// Known to nobody (only the control role, which runs nothing itself,
    /// answers this; hosts answer [`Location::Here`] and 404 locally).
    Unknown,
}

/// A registered host as placement sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostSlot {
    pub id: String,
    pub url: String,
    pub capacity: u32,
    /// Sandboxes it runs now, counted in the store.
    pub live: u32,
    /// Heartbeat within the lease TTL.
    pub alive: bool,
    /// Alive, reconciled and listening: requests for its sandboxes and
    /// requests any host answers go to it (a cordoned or draining host
    /// still is).
    pub routed: bool,
    /// Routed and not held by the operator: new sandboxes and sessions
    /// may be placed on it.
    pub placeable: bool,
    /// Templates it has warm checkpoints of, as of its last heartbeat.
    pub warm: Vec<String>,
}

impl HostSlot {
    pub fn free(&self) -> u32 {
        self.capacity.saturating_sub(self.live)
    }
}

/// What routing needs to know, answered from the shared state store.
#[async_trait]
pub trait Directory: Send + Sync {
    /// The owner of live sandbox `id`.
    async fn sandbox(&self, id: &str) -> Result<Location, RouteError>;
    /// Who serves snapshot `id`: the host whose disk holds it, or, for a
    /// shared one, this host or [`Location::Anywhere`].
    async fn snapshot(&self, id: &str) -> Result<Location, RouteError>;
    /// The host that owns session `id` (runs its runner).
    async fn session(&self, id: &str) -> Result<Location, RouteError>;
    /// Every registered host.
    async fn hosts(&self) -> Result<Vec<HostSlot>, RouteError>;
    /// How many live sandboxes of `tenant` (their `metadata.tenant`) each
    /// host runs; hosts with none are absent.
    async fn tenant_live(&self, tenant: &str) -> Result<BTreeMap<String, u32>, RouteError>;
    /// The tenant that owns what `scope` names (a sandbox's or
    /// snapshot's `metadata.tenant`, a session's tenant), live or stopped;
    /// `None` for the operator's or an unknown one. Asked only before a
    /// tenant key is told about a host that cannot answer for itself.
    async fn tenant_of(&self, scope: &Scope) -> Result<Option<String>, RouteError>;
    /// The snapshot of environment `id`'s current version, which a session
    /// created with that `environment_id` forks (placement prefers a host
    /// with a warm pool of it). `None`: no such environment, none built
    /// yet, or a directory that does not know environments; the host the
    /// session goes to then answers for the environment itself.
    async fn environment_snapshot(&self, _id: &str) -> Result<Option<String>, RouteError> {
        Ok(None)
    }
}

/// Recognises the deployment's tenant API keys (hatchery-tenants; the
/// daemon wires it). A tenant key is forwarded like the API key: the
/// owner checks it again and answers only for the tenant's own things.
#[async_trait]
pub trait TenantKeys: Send + Sync {
    /// The tenant whose live key `bearer` is; `None` for anything else
    /// (`Err`: the store could not tell, [`RouteError::Store`]).
    async fn tenant(&self, bearer: &str) -> Result<Option<String>, RouteError>;
}

/// `host:port` or `http://host:port` (what hosts register) as a base URL.
pub fn base_url(address: &str) -> String {
    if address.contains("://") {
        address.trim_end_matches('/').to_string()
    } else {
        format!("http://{address}")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn base_urls() {
        assert_eq!(super::base_url("127.0.0.1:7423"), "http://127.0.0.1:7423");
        assert_eq!(super::base_url("http://h:1/"), "http://h:1");
    }
}
