//! Typed rows: what the store holds, independent of the backend.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// Lifecycle of a sandbox row. Stored as its lowercase name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxState {
    /// Restored from a template checkpoint, never touched by a request,
    /// waiting in the warm pool. Invisible to the API.
    Pooled,
    Starting,
    Running,
    Stopped,
}

impl SandboxState {
    pub const ALL: [SandboxState; 4] = [
        SandboxState::Pooled,
        SandboxState::Starting,
        SandboxState::Running,
        SandboxState::Stopped,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Pooled => "pooled",
            SandboxState::Starting => "starting",
            SandboxState::Running => "running",
            SandboxState::Stopped => "stopped",
        }
    }

    pub fn parse(s: &str) -> Option<SandboxState> {
        Self::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// The moves the daemon makes. `Running -> Running` is a re-adoption
    /// after a restart; `Pooled -> Pooled` is a warm sandbox's restore
    /// finishing (its row is pooled from the insert on, so the API never
    /// sees it). Nothing ever leaves `Stopped`, so a late "running" can
    /// never overwrite a stop.
    pub fn valid_transition(self, to: SandboxState) -> bool {
        use SandboxState::*;
        matches!(
            (self, to),
            (Starting, Running)
                | (Starting, Pooled)
                | (Pooled, Running)
                | (Running, Running)
                | (Pooled, Pooled)
                | (Pooled | Starting | Running, Stopped)
        )
    }
}

impl fmt::Display for SandboxState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

hatchery_db::record! {
    #[derive(Debug, Clone, PartialEq)]
    pub struct SandboxRow in "core_sandboxes" {
        pub id: String,
        pub template: String,
        pub state: SandboxState,
        pub created_at_ms: u64,
        pub expires_at_ms: u64,
        pub metadata: BTreeMap<String, String>,
        pub env: BTreeMap<String, String>,
        /// The host that runs it. Set by the store from the writer's fence on
        /// insert; whatever the caller puts here is ignored.
        pub host_id: String,
        /// What it was booted on: the template version, its rootfs and its
        /// limits (JSON). Snapshots of it record these, not what the
        /// template has become since, so a rebuild never changes how a
        /// running sandbox is captured. Empty for rows written before they
        /// were recorded (then the template's current ones are used).
        pub template_version: String,
        pub rootfs: String,
        pub limits: String,
    }
}

hatchery_db::record! {
    #[derive(Debug, Clone, PartialEq)]
    pub struct SnapshotRow in "core_snapshots" {
        pub id: String,
        pub sandbox_id: String,
        pub template: String,
        pub created_at_ms: u64,
        pub expires_at_ms: u64,
        pub size_bytes: u64,
        pub metadata: BTreeMap<String, String>,
        /// The sandbox's create-time env, inherited by forks.
        pub env: BTreeMap<String, String>,
        /// What the snapshot must be restored on: the rootfs and resource
        /// shape of its sandbox, independent of later template rebuilds.
        pub rootfs: String,
        pub limits: String,
        /// The template version its sandbox was booted from (empty for
        /// snapshots taken before it was recorded).
        pub template_version: String,
        /// The host that took it (set from the writer's fence).
        pub host_id: String,
        /// Where its image is. A local one is set to the writer's host by
        /// the store, whatever host the caller names.
        pub location: SnapshotLocation,
        /// What its image holds (rows from before it was recorded are
        /// `memory`).
        pub kind: SnapshotKind,
    }
}

hatchery_db::names! {
    /// What a snapshot's image holds, and so how a fork starts from it.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum SnapshotKind {
        /// Memory, processes and files (a runtime checkpoint): a fork
        /// restores it and carries on where the sandbox was.
        Memory = "memory",
        /// Files only (`Runtime::export_files`): a fork boots from the
        /// recorded template and unpacks them; no process survives.
        Files = "files",
    }
}

/// Where a snapshot's image lives: a location, not a path, so any host
/// that can reach it resolves it against its own store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotLocation {
    /// On one host's disk (`local:<host>`): only that host serves it.
    Local { host: String },
    /// In the snapshot store every host mounts (`shared`): any host
    /// serves it, and it outlives its writer.
    Shared,
}

impl SnapshotLocation {
    pub fn as_string(&self) -> String {
        match self {
            SnapshotLocation::Local { host } => format!("local:{host}"),
            SnapshotLocation::Shared => "shared".into(),
        }
    }

    pub fn parse(s: &str) -> Option<SnapshotLocation> {
        if s == "shared" {
            return Some(SnapshotLocation::Shared);
        }
        let host = s.strip_prefix("local:")?;
        valid_host_id(host).then(|| SnapshotLocation::Local { host: host.into() })
    }

    pub fn is_shared(&self) -> bool {
        matches!(self, SnapshotLocation::Shared)
    }

    /// What the store records for a snapshot `writer` inserts.
    pub(crate) fn written_by(&self, writer: &str) -> SnapshotLocation {
        let host = writer.into();
        match self {
            SnapshotLocation::Local { .. } => SnapshotLocation::Local { host },
            SnapshotLocation::Shared => SnapshotLocation::Shared,
        }
    }
}

// Stored as their names; a name that is none of theirs reads as corrupt.
hatchery_db::named!(SandboxState, as_str, parse);
hatchery_db::named!(SnapshotLocation, as_string, parse);

hatchery_db::record! {
    /// One lifecycle event of a sandbox.
    #[derive(Debug, Clone, PartialEq)]
    pub struct Event in "core_events" {
        /// Store-wide, increasing in commit order per backend.
        pub seq: u64,
        pub sandbox_id: String,
        pub at_ms: u64,
        pub kind: String,
        pub detail: String,
        /// The writer's lease epoch when it was committed.
        pub epoch: u64,
    }
}

/// The network slot a live sandbox holds and its policy (JSON), so a
/// restarted daemon keeps both for the sandboxes it adopts.
#[derive(Debug, Clone, PartialEq)]
pub struct NetRow {
    pub sandbox_id: String,
    pub slot: u32,
    pub policy: String,
}

/// A warm pool of a snapshot's forks that a host keeps (hatchery-core's
/// snapshot_pool.rs).
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotPoolRow {
    pub snapshot_id: String,
    pub size: u32,
    /// When it was last asked for: a pool nobody asks for goes cold.
    pub touched_at_ms: u64,
}

/// A lease on a named resource (`host:<id>`, later `session:<id>`). The
/// epoch only grows: every take bumps it, so a writer holding an older
/// epoch is fenced off.
#[derive(Debug, Clone, PartialEq)]
pub struct Lease {
    pub resource: String,
    pub owner: String,
    pub epoch: u64,
    /// Database clock, milliseconds since the epoch.
    pub expires_at_ms: u64,
    /// How long it is still valid, by the database's clock at the moment
    /// of the operation: what a holder should time its renewals on (its
    /// own clock may be skewed).
    pub valid_for_ms: u64,
}

/// What a writer proves with every write: it holds `resource` at `epoch`.
/// The store checks it in the write's own transaction and refuses the
/// write with `StoreError::Fenced` once someone has taken the lease over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub resource: String,
    pub owner: String,
    pub epoch: u64,
}

impl Fence {
    pub fn of(lease: &Lease) -> Fence {
        Fence {
            resource: lease.resource.clone(),
            owner: lease.owner.clone(),
            epoch: lease.epoch,
        }
    }
}

/// A registered host, as the control plane sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct HostRow {
    pub id: String,
    /// Where its API listens (what a router would forward to).
    pub address: String,
    /// Most sandboxes it runs at once, and how many it ran at its last
    /// heartbeat.
    pub capacity: u32,
    pub live: u32,
    /// The lease epoch it registered or last beat under.
    pub epoch: u64,
    pub registered_at_ms: u64,
    /// Since its last heartbeat, by the database's clock.
    pub silent_for_ms: u64,
    /// Templates whose current checkpoint it had on disk at its last
    /// heartbeat: a create there restores it at once instead of baking it
    /// first, so placement prefers these hosts.
    pub warm_templates: Vec<String>,
    /// It has reconciled and listens (its own word, under its lease).
    pub ready: bool,
    /// It was told to stop and is handing its sessions to other hosts
    /// (its own word, under its lease; `ready` stays true: it still
    /// listens and serves what it runs).
    pub stopping: bool,
    /// What the operator asked of it.
    pub hold: crate::HostHold,
    /// The daemon version it registered with.
    pub version: String,
}

impl HostRow {
    /// Its state, given whether its heartbeat is recent enough (the
    /// caller knows the lease TTL).
    pub fn state(&self, alive: bool) -> crate::HostState {
        crate::HostState::of(self.ready, self.stopping, self.hold, alive)
    }
}

/// The end reason of a sandbox stopped because its host was lost (the
/// host-loss sweep, hatchery-hosts); such a sandbox answers 410
/// `sandbox_lost`.
pub const HOST_LOST: &str = "host_lost";

/// A sandbox row that was stopped: when, why, and on which host (what a
/// request for it is told once it is no longer live).
#[derive(Debug, Clone, PartialEq)]
pub struct StoppedRow {
    pub id: String,
    pub host_id: String,
    pub ended_at_ms: u64,
    pub end_reason: String,
}

/// A host id: 1..64 of `[a-z0-9-]`, not starting with `-`. It names rows,
/// leases and (in logs) the machine, so nothing else is accepted.
pub fn valid_host_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && !id.starts_with('-')
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// The lease resource naming a host.
pub fn host_resource(host_id: &str) -> String {
    format!("host:{host_id}")
}

/// Which live sandboxes a list returns. Applied in SQL by both backends.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SandboxFilter {
    /// Every pair must be present in the sandbox's metadata.
    pub metadata: BTreeMap<String, String>,
    pub template: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::SandboxState::*;
    use super::*;

    #[test]
    fn nothing_leaves_stopped() {
        for to in SandboxState::ALL {
            assert!(!Stopped.valid_transition(to), "stopped -> {to}");
        }
        assert!(Starting.valid_transition(Running));
        assert!(!Running.valid_transition(Starting));
        assert!(!Running.valid_transition(Pooled));
        assert!(Pooled.valid_transition(Stopped));
    }

    #[test]
    fn host_ids_are_plain() {
        for ok in ["local", "host-a", "h1", &"a".repeat(64)] {
            assert!(valid_host_id(ok), "{ok}");
        }
        for bad in ["", "-a", "Host", "a b", "a/b", "a:b", &"a".repeat(65)] {
            assert!(!valid_host_id(bad), "{bad}");
        }
    }

    #[test]
    fn snapshot_locations_round_trip() {
        let local = |host: &str| SnapshotLocation::Local { host: host.into() };
        for l in [SnapshotLocation::Shared, local("h-1")] {
            assert_eq!(SnapshotLocation::parse(&l.as_string()), Some(l));
        }
        for bad in ["", "local:", "local:Bad", "shared:/x", "s3", "local"] {
            assert_eq!(SnapshotLocation::parse(bad), None, "{bad}");
        }
        assert_eq!(local("other").written_by("me"), local("me"));
        let shared = SnapshotLocation::Shared;
        assert_eq!(shared.written_by("me"), shared);
    }

    #[test]
    fn states_round_trip() {
        for s in SandboxState::ALL {
            assert_eq!(SandboxState::parse(s.as_str()), Some(s));
        }
        assert_eq!(SandboxState::parse("lost"), None);
    }
}
