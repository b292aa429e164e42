//! The daemon's state behind one async [`Store`] trait, kept in the
//! deployment's one database ([`DbStore`] over hatchery-db: SQLite, the
//! embedded default, or PostgreSQL, shared by many hosts) with one set of
//! SQL. Numbered migrations, every multi-statement change in one
//! transaction, state updates guarded by the states they may move from,
//! metadata filtered in SQL, and the writer's lease epoch ([`Fence`])
//! checked in the same transaction as the write. One conformance suite
//! ([`conformance`]) runs on both databases.

mod bounded;
pub mod conformance;
mod db;
mod error;
mod host_state;
mod rows;

pub use bounded::{Bounded, CALL_LIMIT};
pub use db::{DbStore, IMPORT, SCHEMA};
pub use error::{BoxError, Result, StoreError};
pub use host_state::{HostHold, HostState};
pub use rows::{
    host_resource, valid_host_id, Event, Fence, HostRow, Lease, NetRow, SandboxFilter, SandboxRow,
    SandboxState, SnapshotKind, SnapshotLocation, SnapshotPoolRow, SnapshotRow, StoppedRow,
    HOST_LOST,
};

use async_trait::async_trait;
use std::collections::BTreeMap;
use std::sync::Arc;

pub use hatchery_db::{is_postgres, DEFAULT_PG_POOL};

/// Declares [`Store`] and its [`Bounded`] forwarding from one list of
/// methods: every method of the trait is bounded, so nothing escapes the
/// limit.
macro_rules! store {
    ($($(#[$doc:meta])* async fn $name:ident(&self $(, $arg:ident: $ty:ty)*) -> $ret:ty;)*) => {
        /// Every write that changes state takes the writer's [`Fence`] and fails
        /// with [`StoreError::Fenced`] if the lease has moved on. Writes to a
        /// sandbox or snapshot touch only rows of the fence's owner (the host).
        #[async_trait]
        pub trait Store: Send + Sync {
            /// "sqlite" or "postgres".
            fn backend(&self) -> &'static str;
            $($(#[$doc])* async fn $name(&self $(, $arg: $ty)*) -> $ret;)*
        }

        #[async_trait]
        impl Store for Bounded {
            fn backend(&self) -> &'static str {
                self.inner.backend()
            }
            $(async fn $name(&self $(, $arg: $ty)*) -> $ret {
                self.run(stringify!($name), self.inner.$name($($arg),*)).await
            })*
        }
    };
}

store! {
    // --- sandboxes -------------------------------------------------------

    /// Records a new sandbox (owned by `f.owner`) and its "created" event.
    async fn insert_sandbox(&self, f: &Fence, r: &SandboxRow) -> Result<()>;
    /// Moves `id` to `to` if it is in one of `from` (each of which must be
    /// a valid transition to `to`), with an event named after `to`.
    /// `false` if the row was in none of them (or is another host's).
    async fn transition(
        &self, f: &Fence, id: &str, from: &[SandboxState], to: SandboxState
    ) -> Result<bool>;
    /// Marks a sandbox stopped from whatever live state it is in; `false`
    /// if it already was (or is unknown).
    async fn stop(&self, f: &Fence, id: &str, reason: &str, now_ms: u64) -> Result<bool>;
    /// Hands a pooled sandbox to a request: from here on it is a running
    /// sandbox with `r`'s times, metadata and env.
    async fn claim(&self, f: &Fence, r: &SandboxRow) -> Result<bool>;
    /// New expiry for a sandbox that is not stopped.
    async fn set_expiry(&self, f: &Fence, id: &str, expires_at_ms: u64) -> Result<bool>;
    /// A starting or running sandbox, on any host.
    async fn get_live(&self, id: &str) -> Result<Option<SandboxRow>>;
    /// A stopped sandbox, on any host: its row (metadata included), and
    /// when and why it ended.
    async fn get_stopped(&self, id: &str) -> Result<Option<(SandboxRow, StoppedRow)>>;
    /// Starting and running sandboxes of every host matching `filter`,
    /// oldest first.
    async fn list_live(&self, filter: &SandboxFilter) -> Result<Vec<SandboxRow>>;
    /// Stopped sandboxes of every host that ended for `reason` (e.g.
    /// [`HOST_LOST`]) and match `filter`, the most recently ended first,
    /// at most `limit`: each row with when and why it ended.
    async fn list_stopped(
        &self, reason: &str, filter: &SandboxFilter, limit: usize
    ) -> Result<Vec<(SandboxRow, StoppedRow)>>;
    /// Every row of `host` not stopped, pooled ones included: what
    /// reconcile must account for on that host.
    async fn list_unstopped(&self, host: &str) -> Result<Vec<SandboxRow>>;
    /// Ids of `host`'s unstopped sandboxes whose expiry is at or before
    /// `now_ms`.
    async fn expired(&self, host: &str, now_ms: u64) -> Result<Vec<String>>;
    async fn append_event(&self, f: &Fence, id: &str, kind: &str, detail: &str) -> Result<u64>;
    async fn events(&self, id: &str) -> Result<Vec<Event>>;

    // --- snapshots -------------------------------------------------------

    async fn insert_snapshot(&self, f: &Fence, s: &SnapshotRow) -> Result<()>;
    async fn get_snapshot(&self, id: &str) -> Result<Option<SnapshotRow>>;
    /// Snapshots whose metadata holds every pair of `filter`, oldest first.
    async fn list_snapshots(&self, filter: &BTreeMap<String, String>) -> Result<Vec<SnapshotRow>>;
    async fn count_snapshots_of(&self, template: &str) -> Result<u64>;
    /// Bytes the snapshots recorded at `location` take (its storage cap
    /// is checked against it).
    async fn snapshot_bytes(&self, location: &SnapshotLocation) -> Result<u64>;
    /// Deletes the row of a snapshot local to the fence's host, or of a
    /// shared one (any host may). `true` for the one caller whose delete
    /// removed the row: that caller, and only it, removes a shared image's
    /// files, so hosts sweeping at once never race on them.
    async fn delete_snapshot(&self, f: &Fence, id: &str) -> Result<bool>;
    /// Expired snapshots local to `host`.
    async fn expired_snapshots(&self, host: &str, now_ms: u64) -> Result<Vec<String>>;
    /// Expired snapshots in the shared store (whoever wrote them).
    async fn expired_shared_snapshots(&self, now_ms: u64) -> Result<Vec<String>>;

    // --- snapshot pools --------------------------------------------------

    /// Remembers that host `f.owner` keeps `size` forks of `snapshot`
    /// warm, asked at `touched_at_ms` (so a restarted daemon fills the pool
    /// again while it is still hot); `size` 0 forgets it.
    async fn set_snapshot_pool(
        &self, f: &Fence, snapshot: &str, size: u32, touched_at_ms: u64
    ) -> Result<()>;
    /// The snapshot pools host `host` keeps, by snapshot id.
    async fn snapshot_pools(&self, host: &str) -> Result<Vec<SnapshotPoolRow>>;

    // --- network slots ---------------------------------------------------

    /// Records `id`'s slot and policy; with `event`, also a
    /// "network_policy" event, in the same transaction.
    async fn set_net(
        &self, f: &Fence, id: &str, slot: u32, policy: &str, event: bool
    ) -> Result<()>;
    async fn clear_net(&self, f: &Fence, id: &str) -> Result<()>;
    /// Every slot recorded for `host`.
    async fn all_net(&self, host: &str) -> Result<Vec<NetRow>>;

    // --- leases ----------------------------------------------------------

    /// Takes `resource` for `owner` for `ttl_ms` by the database's clock,
    /// with a new, higher epoch. Refused with `LeaseHeld` while another
    /// owner's lease is unexpired. The same owner may always take it
    /// again: a restarted host fences off its previous incarnation.
    async fn take_lease(&self, resource: &str, owner: &str, ttl_ms: u64) -> Result<Lease>;
    /// Extends the fence's lease; `Fenced` if it was taken over.
    async fn renew_lease(&self, f: &Fence, ttl_ms: u64) -> Result<Lease>;
    /// Ends the lease now (keeping its epoch, so the next take is higher);
    /// `false` if it was not held at that epoch.
    async fn release_lease(&self, f: &Fence) -> Result<bool>;
    async fn get_lease(&self, resource: &str) -> Result<Option<Lease>>;

    // --- hosts -----------------------------------------------------------

    /// Registers (or re-registers) the fence's owner as a host. The fence
    /// must be that host's own lease (`host:<id>`): a host cannot register
    /// under another's identity, and a second process with the same id
    /// registers only by taking the lease, which fences the first.
    /// It registers as `starting` (not placed on or routed to until
    /// [`Store::host_ready`]); an operator's hold is kept.
    async fn register_host(
        &self, f: &Fence, address: &str, capacity: u32, version: &str
    ) -> Result<()>;
    /// Marks the fence's host `ready` (it has reconciled and listens);
    /// `false` if it was not registered under this epoch or not starting.
    async fn host_ready(&self, f: &Fence) -> Result<bool>;
    /// Marks the fence's host `stopping` (told to stop: it takes no new
    /// work and hands its sessions elsewhere, still serving what it runs
    /// until it exits); `false` if it was not registered under this
    /// epoch. Its next registration makes it `starting` again.
    async fn host_stopping(&self, f: &Fence) -> Result<bool>;
    /// The operator's cordon, drain and uncordon: moves host `id`'s hold
    /// to `to` if it is in one of `from` (each of which must be `to` or a
    /// valid transition to it). Guarded, not fenced: the operator holds
    /// no lease, and the host never writes its hold. `false` if the host
    /// is unknown or its hold was in none of `from`.
    async fn hold_host(&self, id: &str, from: &[HostHold], to: HostHold) -> Result<bool>;
    /// Records that the host is alive, with how many sandboxes it runs and
    /// which templates it has warm checkpoints of; `false` if it never
    /// registered.
    async fn heartbeat(&self, f: &Fence, live: u32, warm_templates: &[String]) -> Result<bool>;
    /// Every registered host, by id.
    async fn list_hosts(&self) -> Result<Vec<HostRow>>;
    /// How many starting or running sandboxes matching `filter` each host
    /// has, counted in SQL (with an empty filter, what placement compares
    /// with capacity; with a tenant's metadata, how it spreads a tenant);
    /// hosts with none are absent.
    async fn live_per_host(&self, filter: &SandboxFilter) -> Result<BTreeMap<String, u32>>;

    // --- the deployment's secrets ------------------------------------------

    /// The secret named `name` that every daemon on this database shares:
    /// the first caller's `candidate` is kept, and every later call (from
    /// any daemon, at any time) gets that one back. `name` and `candidate`
    /// are constants and random values of the daemon, never client input.
    async fn deployment_secret(&self, name: &str, candidate: &str) -> Result<String>;
}

/// Refuses a fence that is not the lease of the host it names.
pub(crate) fn check_host_fence(f: &Fence) -> Result<()> {
    if !valid_host_id(&f.owner) || f.resource != host_resource(&f.owner) {
        return Err(StoreError::Corrupt(format!(
            "{} cannot register as a host with lease {}",
            f.owner, f.resource
        )));
    }
    Ok(())
}

/// The state store in the deployment's database, its migrations run. On
/// PostgreSQL every call is bounded in time ([`Bounded`]): a database that
/// stops answering is a 503, not a hung request.
pub async fn open(db: hatchery_db::Db) -> Result<Arc<dyn Store>> {
    let postgres = db.dialect() == hatchery_db::Dialect::Postgres;
    let s: Arc<dyn Store> = Arc::new(DbStore::open(db).await?);
    Ok(if postgres {
        Arc::new(Bounded::new(s, CALL_LIMIT))
    } else {
        s
    })
}

pub(crate) fn to_json(m: &BTreeMap<String, String>) -> String {
    serde_json::to_string(m).unwrap_or_else(|_| "{}".into())
}

/// What a host stored as its warm templates; anything unreadable is none
/// (it only steers placement, and the next heartbeat writes it again).
pub(crate) fn warm_list(s: &str) -> Vec<String> {
    serde_json::from_str(s).unwrap_or_default()
}
