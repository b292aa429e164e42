//! Answers hatchery-route's questions (who owns this sandbox, which hosts
//! are alive and how full) from the shared state store. A host is alive
//! while its last heartbeat, by the database's clock, is within the host
//! lease TTL ([`crate::alive`]).

use crate::local::LocalSandboxes;
use async_trait::async_trait;
use hatchery_route::placement::TENANT_KEY;
use hatchery_route::{base_url, Directory, HostSlot, Location, RouteError, Scope};
use hatchery_sessions::environments::store::EnvStore;
use hatchery_store::{HostState, SandboxFilter, SnapshotLocation, Store, StoreError};
use std::collections::BTreeMap;
use std::sync::Arc;

pub struct StoreDirectory {
    pub store: Arc<dyn Store>,
    /// This daemon's host id.
    pub me: String,
    /// The host lease TTL: a host silent for longer is not alive.
    pub lease_ttl_ms: u64,
    /// The local manager (roles `all` and `host`): a sandbox it runs is
    /// answered without a query.
    pub local: Option<Arc<dyn LocalSandboxes>>,
    /// The shared session store: which host owns a session.
    pub sessions: Option<Arc<dyn hatchery_sessions::store::SessionStore>>,
    /// The environments' tables: the snapshot a session from an
    /// environment forks (the control role's placement).
    pub environments: Option<EnvStore>,
}

fn store_err(e: StoreError) -> RouteError {
    RouteError::Store(e.to_string())
}

impl StoreDirectory {
    fn alive(&self, silent_for_ms: u64) -> bool {
        crate::alive(silent_for_ms, self.lease_ttl_ms)
    }

    /// An id that names no live sandbox may be an E2B id that outlived
    /// its first sandbox (hatchery-e2b state.rs): resumed into another
    /// one (that sandbox's metadata names it: routed to its host), or
    /// paused (a snapshot's metadata names it: routed as that snapshot,
    /// where the resume will restore it). Only ids that look like a
    /// sandbox's are looked up, so other 404s cost no query.
    async fn e2b_alias(&self, id: &str) -> Result<Location, RouteError> {
        if !hatchery_core::valid_sandbox_id(id) {
            return Ok(Location::Unknown);
        }
        let by = |k: &str| BTreeMap::from([(k.to_string(), id.to_string())]);
        let resumed = self
            .store
            .list_live(&SandboxFilter {
                metadata: by(hatchery_e2b::state::ALIAS_KEY),
                template: None,
            })
            .await
            .map_err(store_err)?;
        if let Some(row) = resumed.first() {
            if self.local.as_ref().is_some_and(|m| m.runs_here(&row.id)) {
                return Ok(Location::Here);
            }
            return self.owner(&row.host_id).await;
        }
        let paused = self
            .store
            .list_snapshots(&by(hatchery_e2b::state::PAUSED_KEY))
            .await
            .map_err(store_err)?;
        match paused.first() {
            Some(s) => self.snapshot(&s.id).await,
            None => Ok(Location::Unknown),
        }
    }

    /// A sandbox the sweeper stopped because its host was lost says so
    /// (410 `sandbox_lost`, when and why) rather than being unknown.
    async fn lost(&self, id: &str) -> Result<Location, RouteError> {
        if !hatchery_core::valid_sandbox_id(id) {
            return Ok(Location::Unknown);
        }
        Ok(match self.store.get_stopped(id).await.map_err(store_err)? {
            Some((_, r)) if r.end_reason == crate::sweeper::LOST_REASON => Location::Gone {
                host: r.host_id,
                at_ms: r.ended_at_ms,
                reason: format!(
                    "its host stopped heartbeating for longer than the host lease ({} ms) and the sandbox was marked {}",
                    self.lease_ttl_ms,
                    crate::sweeper::LOST_REASON
                ),
            },
            _ => Location::Unknown,
        })
    }

    async fn owner(&self, host: &str) -> Result<Location, RouteError> {
        if host == self.me {
            return Ok(Location::Here);
        }
        let hosts = self.store.list_hosts().await.map_err(store_err)?;
        Ok(match hosts.into_iter().find(|h| h.id == host) {
            Some(h) => match h.state(self.alive(h.silent_for_ms)) {
                s if s.routed() => Location::At {
                    host: h.id,
                    url: base_url(&h.address),
                },
                HostState::Starting => Location::Starting { host: h.id },
                _ => Location::Lost { host: h.id },
            },
            None => Location::Lost { host: host.into() },
        })
    }
}

#[async_trait]
impl Directory for StoreDirectory {
    async fn sandbox(&self, id: &str) -> Result<Location, RouteError> {
        if self.local.as_ref().is_some_and(|m| m.runs_here(id)) {
            return Ok(Location::Here);
        }
        if let Some(row) = self.store.get_live(id).await.map_err(store_err)? {
            return self.owner(&row.host_id).await;
        }
        match self.e2b_alias(id).await? {
            Location::Unknown => self.lost(id).await,
            found => Ok(found),
        }
    }

    async fn snapshot(&self, id: &str) -> Result<Location, RouteError> {
        let Some(row) = self.store.get_snapshot(id).await.map_err(store_err)? else {
            return Ok(Location::Unknown);
        };
        match (&row.location, &self.local) {
            (SnapshotLocation::Local { host }, _) => self.owner(host).await,
            // In the shared store: not pinned to its writer, which may be
            // lost; any host that mounts the store serves it.
            (SnapshotLocation::Shared, Some(m)) if m.has_shared_snapshots() => Ok(Location::Here),
            (SnapshotLocation::Shared, None) => Ok(Location::Anywhere),
            // A host without the mount: its writer has one.
            (SnapshotLocation::Shared, Some(_)) => self.owner(&row.host_id).await,
        }
    }

    async fn session(&self, id: &str) -> Result<Location, RouteError> {
        use hatchery_sessions::store::StoreError as S;
        let Some(store) = &self.sessions else {
            return Ok(Location::Here);
        };
        match store.get(id).await {
            // Ended: nothing will write it again, and every host reads it
            // from the shared store, so its owner need not be up.
            Ok(s) if s.state.is_terminal() && self.local.is_some() => Ok(Location::Here),
            Ok(s) if s.state.is_terminal() => Ok(Location::Anywhere),
            Ok(s) => self.owner(&s.host_id).await,
            // The local handler answers 404 (or its own 400 for a bad id).
            Err(S::NotFound(_)) if self.local.is_some() => Ok(Location::Here),
            Err(S::NotFound(_)) => Ok(Location::Unknown),
            Err(e) => Err(RouteError::Store(e.to_string())),
        }
    }

    async fn hosts(&self) -> Result<Vec<HostSlot>, RouteError> {
        let hosts = self.store.list_hosts().await.map_err(store_err)?;
        // Counted from the rows, not the heartbeats (up to 10 s old), so a
        // burst of creates sees each other.
        let live = self
            .store
            .live_per_host(&SandboxFilter::default())
            .await
            .map_err(store_err)?;
        Ok(hosts
            .into_iter()
            .map(|h| {
                let alive = self.alive(h.silent_for_ms);
                let state = h.state(alive);
                HostSlot {
                    live: live.get(&h.id).copied().unwrap_or(0),
                    url: base_url(&h.address),
                    capacity: h.capacity,
                    alive,
                    routed: state.routed(),
                    placeable: state.placeable(),
                    warm: h.warm_templates,
                    id: h.id,
                }
            })
            .collect())
    }

    async fn tenant_live(&self, tenant: &str) -> Result<BTreeMap<String, u32>, RouteError> {
        let filter = SandboxFilter {
            metadata: [(TENANT_KEY.to_string(), tenant.to_string())].into(),
            template: None,
        };
        self.store.live_per_host(&filter).await.map_err(store_err)
    }

    async fn environment_snapshot(&self, id: &str) -> Result<Option<String>, RouteError> {
        let Some(envs) = &self.environments else {
            return Ok(None);
        };
        let rec = envs
            .get(id)
            .await
            .map_err(|e| RouteError::Store(e.to_string()))?;
        Ok(rec.and_then(|r| r.current().map(|v| v.snapshot_id.clone())))
    }

    async fn tenant_of(&self, scope: &Scope) -> Result<Option<String>, RouteError> {
        let of = |m: &BTreeMap<String, String>| m.get(TENANT_KEY).cloned();
        Ok(match scope {
            Scope::Sandbox(id) => match self.store.get_live(id).await.map_err(store_err)? {
                Some(row) => of(&row.metadata),
                None => self
                    .store
                    .get_stopped(id)
                    .await
                    .map_err(store_err)?
                    .and_then(|(row, _)| of(&row.metadata)),
            },
            Scope::Snapshot(id) => self
                .store
                .get_snapshot(id)
                .await
                .map_err(store_err)?
                .and_then(|row| of(&row.metadata)),
            Scope::Session(id) => match &self.sessions {
                Some(store) => match store.get(id).await {
                    Ok(s) => s.spec.tenant,
                    Err(hatchery_sessions::store::StoreError::NotFound(_)) => None,
                    Err(e) => return Err(RouteError::Store(e.to_string())),
                },
                None => None,
            },
            Scope::Other => None,
        })
    }
}
