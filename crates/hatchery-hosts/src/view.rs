//! What `GET /v1/hosts` shows of a host: its row in the shared store, its
//! state (lost from the heartbeat's age by the database's clock), and its
//! load counted from the sandbox and session rows.

use hatchery_store::{HostRow, HostState};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Host {
    pub id: String,
    /// Where its API listens (what the control plane forwards to).
    pub address: String,
    /// `starting` (registered, not yet reconciled and listening), `ready`,
    /// `cordoned` or `draining` (no new placement; its sandboxes still
    /// routed), `lost` (no heartbeat within the host lease).
    #[schema(value_type = String, example = "ready")]
    pub state: HostState,
    /// It was told to stop (SIGTERM) and is moving its sessions to other
    /// hosts before it exits (shown `draining`, whatever the operator's
    /// hold).
    pub stopping: bool,
    /// Starting and running sandboxes it owns, counted in the store.
    pub live_sandboxes: u32,
    /// Its sessions not yet completed, failed or cancelled.
    pub live_sessions: u32,
    /// Most sandboxes it runs at once.
    pub capacity: u32,
    /// Since its last heartbeat, by the database's clock.
    pub heartbeat_age_ms: u64,
    /// When it last registered (started), unix milliseconds.
    pub registered_at_ms: u64,
    /// The daemon version it registered with.
    pub version: String,
    /// Templates it has warm checkpoints of (placement prefers it for them).
    pub warm_templates: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct HostList {
    pub hosts: Vec<Host>,
}

impl Host {
    pub fn of(
        h: HostRow,
        lease_ttl_ms: u64,
        live: &BTreeMap<String, u32>,
        sessions: &BTreeMap<String, u32>,
    ) -> Host {
        Host {
            state: h.state(crate::alive(h.silent_for_ms, lease_ttl_ms)),
            stopping: h.stopping,
            live_sandboxes: live.get(&h.id).copied().unwrap_or(0),
            live_sessions: sessions.get(&h.id).copied().unwrap_or(0),
            capacity: h.capacity,
            heartbeat_age_ms: h.silent_for_ms,
            registered_at_ms: h.registered_at_ms,
            version: h.version,
            warm_templates: h.warm_templates,
            address: h.address,
            id: h.id,
        }
    }
}
