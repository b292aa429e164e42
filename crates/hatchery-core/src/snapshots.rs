//! Snapshots and forks. A snapshot checkpoints a running sandbox (it keeps
//! running) into a sealed image: files, including ones deleted from an
//! editor but still open, processes and installed packages. A fork restores
//! that image into new, independent sandboxes.
//!
//! A files-only snapshot ([`SnapshotKind::Files`], a filesystem-only
//! pause) holds no memory: the files the sandbox created or changed, as
//! the runtime exports them. A fork of it starts from the recorded
//! template (its checkpoint if one is baked, else a cold boot) and the
//! files are unpacked into it before anyone can use it; no process of the
//! sandbox survives.

use crate::ids::{new_sandbox_id, new_snapshot_id, valid_snapshot_id};
use crate::manager::SandboxInfo;
use crate::snapshot_stores::store_err;
use crate::store::{SandboxRow, SandboxState, SnapshotKind, SnapshotLocation, SnapshotRow};
use crate::{now_ms, CoreError, Manager};
use hatchery_templates::Template;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// The file a files-only snapshot's image holds (the runtime's export).
pub const FILES_ARCHIVE: &str = "files.export";

/// Room a files-only snapshot may take beyond the sandbox's disk: the
/// archive's own headers (512 bytes or more per entry), so a disk full of
/// small files still fits. Anything larger fails the snapshot (409
/// `files_too_large`) rather than filling the host's snapshot store.
pub const FILES_HEADROOM_BYTES: u64 = 64 << 20;

#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotInfo {
    pub id: String,
    pub sandbox_id: String,
    pub template: String,
    pub created_at_ms: u64,
    pub expires_at_ms: u64,
    pub size_bytes: u64,
    pub metadata: BTreeMap<String, String>,
    /// Whether it holds memory and processes (a checkpoint) or only files.
    pub kind: SnapshotKind,
}

impl From<SnapshotRow> for SnapshotInfo {
    fn from(r: SnapshotRow) -> Self {
        SnapshotInfo {
            id: r.id,
            sandbox_id: r.sandbox_id,
            template: r.template,
            created_at_ms: r.created_at_ms,
            expires_at_ms: r.expires_at_ms,
            size_bytes: r.size_bytes,
            metadata: r.metadata,
            kind: r.kind,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct ForkRequest {
    pub ttl_seconds: Option<u64>,
    pub metadata: BTreeMap<String, String>,
    pub count: usize,
    /// Every fork's egress policy (default deny-all; not inherited).
    pub network: hatchery_net::Policy,
}

/// What a fork restores (see [`Manager::fork_source`]).
pub(crate) struct ForkSource {
    pub template: Template,
    pub image: Option<PathBuf>,
    pub files: Option<PathBuf>,
    pub mode: &'static str,
}

impl Manager {
    /// A checkpoint of running sandbox `sandbox_id`: memory, processes
    /// and files. The sandbox keeps running.
    pub async fn snapshot(
        &self,
        sandbox_id: &str,
        retention_s: Option<u64>,
        metadata: BTreeMap<String, String>,
    ) -> Result<SnapshotInfo, CoreError> {
        self.take_snapshot(sandbox_id, retention_s, metadata, SnapshotKind::Memory)
            .await
    }

    /// The files sandbox `sandbox_id` created or changed since it started
    /// (not its memory or processes): a filesystem-only pause. The sandbox
    /// keeps running. At most its disk plus [`FILES_HEADROOM_BYTES`].
    pub async fn snapshot_files(
        &self,
        sandbox_id: &str,
        retention_s: Option<u64>,
        metadata: BTreeMap<String, String>,
    ) -> Result<SnapshotInfo, CoreError> {
        self.take_snapshot(sandbox_id, retention_s, metadata, SnapshotKind::Files)
            .await
    }

    async fn take_snapshot(
        &self,
        sandbox_id: &str,
        retention_s: Option<u64>,
        metadata: BTreeMap<String, String>,
        kind: SnapshotKind,
    ) -> Result<SnapshotInfo, CoreError> {
        let retention = retention_s.unwrap_or(self.caps.default_retention_s);
        crate::within("retention_seconds", retention, self.caps.max_retention_s)?;
        let mut steps = crate::steps::Steps::new();
        // A checkpoint and a file export reach the guest without an agent
        // channel: the sandbox must run, and stay running, until they end.
        let _running = self.live_get(sandbox_id).await?.idle.hold();
        steps.mark("hold");
        let row = self
            .store
            .get_live(sandbox_id)
            .await?
            .ok_or_else(|| CoreError::SandboxNotFound(sandbox_id.into()))?;
        // Restores need exactly the rootfs and shape this sandbox was
        // booted on: its own record, or (a row from before they were
        // recorded) its template's.
        let (template_version, rootfs, limits) = if row.rootfs.is_empty() {
            let t = self.templates().get(&row.template)?;
            let limits = t.limits_json();
            (t.version, t.rootfs.to_string_lossy().into_owned(), limits)
        } else {
            (row.template_version, row.rootfs, row.limits)
        };
        let id = new_snapshot_id();
        let (images, location) = self.snapshots.for_new(self.host_id());
        // A full store is refused before the sandbox is paused at all.
        self.store_room(&location, 1).await?;
        let dir = images.prepare(&id).map_err(store_err)?;
        steps.mark("prepare");
        let sealed = async {
            match kind {
                SnapshotKind::Memory => self.runtime.checkpoint(sandbox_id, &dir).await?,
                SnapshotKind::Files => {
                    let disk_mb = serde_json::from_str::<hatchery_runtime::Limits>(&limits)
                        .map(|l| l.disk_mb)
                        .map_err(|e| CoreError::Internal(format!("limits of {sandbox_id}: {e}")))?;
                    let cap = (disk_mb << 20) + FILES_HEADROOM_BYTES;
                    self.runtime
                        .export_files(sandbox_id, row.created_at_ms, &dir.join(FILES_ARCHIVE), cap)
                        .await?;
                }
            }
            steps.mark("checkpoint");
            let sealed = images.publish(&id).map_err(store_err);
            steps.mark("seal");
            sealed
        }
        .await;
        // Its size is known only now: one that does not fit is removed
        // (concurrent snapshots may each pass; the overshoot is at most
        // one snapshot per concurrent writer).
        let sealed = match sealed {
            Ok(s) => self.store_room(&location, s.size_bytes).await.map(|_| s),
            Err(e) => Err(e),
        };
        let sealed = match sealed {
            Ok(s) => s,
            Err(e) => {
                let _ = images.remove(&id);
                return Err(e);
            }
        };
        let now = now_ms();
        let snap = SnapshotRow {
            id: id.clone(),
            sandbox_id: sandbox_id.to_string(),
            template: row.template.clone(),
            created_at_ms: now,
            expires_at_ms: now + retention * 1000,
            size_bytes: sealed.size_bytes,
            metadata,
            env: row.env,
            rootfs,
            limits,
            template_version,
            host_id: self.host_id().to_string(),
            location,
            kind,
        };
        if let Err(e) = self.store.insert_snapshot(&self.fence, &snap).await {
            let _ = images.remove(&id);
            return Err(e.into());
        }
        steps.mark("row");
        self.metrics.snapshots_created.inc();
        tracing::info!(snapshot = %id, sandbox = %sandbox_id, bytes = sealed.size_bytes, location = %snap.location.as_string(), kind = kind.as_str(), %steps, "snapshot taken");
        Ok(snap.into())
    }

    /// `need` more bytes fit in the store at `location` under the cap.
    async fn store_room(&self, location: &SnapshotLocation, need: u64) -> Result<(), CoreError> {
        let cap = self.caps.max_snapshot_store_bytes;
        if cap == 0 {
            return Ok(());
        }
        let used = self.store.snapshot_bytes(location).await?;
        if used.saturating_add(need) > cap {
            self.metrics.snapshot_store_full.inc();
            return Err(CoreError::SnapshotStoreFull { used, need, cap });
        }
        Ok(())
    }

    pub async fn get_snapshot(&self, id: &str) -> Result<SnapshotInfo, CoreError> {
        if !valid_snapshot_id(id) {
            return Err(CoreError::SnapshotNotFound(id.into()));
        }
        self.store
            .get_snapshot(id)
            .await?
            .map(Into::into)
            .ok_or_else(|| CoreError::SnapshotNotFound(id.into()))
    }

    pub async fn list_snapshots(
        &self,
        filter: &BTreeMap<String, String>,
    ) -> Result<Vec<SnapshotInfo>, CoreError> {
        Ok(self
            .store
            .list_snapshots(filter)
            .await?
            .into_iter()
            .map(Into::into)
            .collect())
    }

    /// Idempotent; really frees the space. A local image goes before its
    /// row (a crash in between leaves a row whose fork answers not found,
    /// never orphaned bytes); a shared one after it: the row's delete is
    /// the guard that makes exactly one of several hosts deleting at once
    /// (expiry sweeps run on every host) remove the files.
    pub async fn delete_snapshot(&self, id: &str) -> Result<(), CoreError> {
        if !valid_snapshot_id(id) {
            return Ok(());
        }
        // Its warm forks are stopped by the pool filler's next round
        // (snapshot_pool.rs), which stops whatever nobody wants.
        self.snapshot_pools.remove(id);
        // And not filled again by a restart (snapshot_pool.rs).
        self.forget_snapshot_pool(id).await;
        let Some(row) = self.store.get_snapshot(id).await? else {
            // Files of a snapshot whose row is gone (a crash between the
            // two): this host's own only.
            return self.snapshots.local().remove(id).map_err(store_err);
        };
        let images = self.snapshots.for_row(id, &row.location, self.host_id())?;
        if row.location.is_shared() {
            if self.store.delete_snapshot(&self.fence, id).await? {
                images.remove(id).map_err(store_err)?;
                tracing::info!(snapshot = %id, location = "shared", "snapshot deleted");
            }
            return Ok(());
        }
        images.remove(id).map_err(store_err)?;
        if self.store.delete_snapshot(&self.fence, id).await? {
            tracing::info!(snapshot = %id, "snapshot deleted");
        }
        Ok(())
    }

    /// New sandboxes from a snapshot, each independent. All or nothing: if
    /// one fails, the ones already made are stopped.
    pub async fn fork(
        self: &Arc<Self>,
        snapshot_id: &str,
        req: ForkRequest,
    ) -> Result<Vec<SandboxInfo>, CoreError> {
        crate::within("count", req.count as u64, self.caps.max_fork_count as u64)?;
        let ttl = req.ttl_seconds.unwrap_or(self.caps.default_ttl_s);
        crate::within("ttl_seconds", ttl, self.caps.max_ttl_s)?;
        self.check_policy(&req.network)?;
        let snap = self
            .store
            .get_snapshot(snapshot_id)
            .await?
            .ok_or_else(|| CoreError::SnapshotNotFound(snapshot_id.into()))?;
        let warm = self.snapshot_pools.touch(snapshot_id);
        // Resolved only when a fork restores: verifying the image hashes
        // all of it, which a claim from the warm pool must not pay (its
        // forks were restored from the verified image).
        let mut src: Option<ForkSource> = None;
        let mut made: Vec<SandboxInfo> = Vec::new();
        for _ in 0..req.count {
            let (res, steps) = crate::steps::Steps::scope(async {
                self.reserve()?;
                if warm {
                    let r = self.claim_warm_fork(&snap, ttl, &req).await;
                    if let Some(r) = r.transpose() {
                        self.unreserve();
                        return r;
                    }
                    self.metrics.snapshot_pool_misses.inc();
                }
                let src = match &src {
                    Some(s) => s,
                    None => match self.fork_source(&snap) {
                        Ok(s) => src.insert(s),
                        Err(e) => {
                            self.unreserve();
                            return Err(e);
                        }
                    },
                };
                crate::steps::mark("verify");
                let started = Instant::now();
                let row = self.fork_row(&snap, new_sandbox_id(), SandboxState::Starting, ttl, &req);
                let r = self
                    .boot_row(
                        row,
                        &req.network,
                        &src.template,
                        src.image.as_deref(),
                        src.files.as_deref(),
                        src.mode,
                        started,
                    )
                    .await;
                self.unreserve();
                r
            })
            .await;
            match res {
                Ok(info) => {
                    tracing::info!(snapshot = %snapshot_id, sandbox = %info.id, %steps, "forked");
                    made.push(info)
                }
                Err(e) => {
                    for m in &made {
                        self.stop(&m.id, "fork_failed").await;
                    }
                    return Err(e);
                }
            }
        }
        Ok(made)
    }

    /// The record of a fork of `snap` made now: the snapshot's template,
    /// rootfs, shape and env, the request's metadata and TTL.
    pub(crate) fn fork_row(
        &self,
        snap: &SnapshotRow,
        id: String,
        state: SandboxState,
        ttl: u64,
        req: &ForkRequest,
    ) -> SandboxRow {
        let now = now_ms();
        SandboxRow {
            id,
            template: snap.template.clone(),
            state,
            created_at_ms: now,
            expires_at_ms: now + ttl * 1000,
            metadata: req.metadata.clone(),
            env: snap.env.clone(),
            host_id: self.host_id().to_string(),
            template_version: snap.template_version.clone(),
            rootfs: snap.rootfs.clone(),
            limits: snap.limits.clone(),
        }
    }

    /// What a fork of `snap` restores: its record, the template (rootfs
    /// and shape) it was taken on, and the image and files.
    pub(crate) fn fork_source(&self, snap: &SnapshotRow) -> Result<ForkSource, CoreError> {
        let snapshot_id = snap.id.as_str();
        let dir = self
            .snapshots
            .for_row(snapshot_id, &snap.location, self.host_id())?
            .verify(snapshot_id)
            .map_err(store_err)?;
        // The rootfs and shape recorded with the snapshot, not whatever
        // the template has become since.
        let mut spec = hatchery_templates::TemplateSpec::named(&snap.template);
        let limits: hatchery_runtime::Limits = serde_json::from_str(&snap.limits)
            .map_err(|e| CoreError::SnapshotCorrupt(format!("snapshot record: {e}")))?;
        (spec.cpus, spec.memory_mb, spec.pids_max, spec.disk_mb) = (
            limits.cpus,
            limits.memory_mb,
            limits.pids_max,
            limits.disk_mb,
        );
        let template = Template {
            spec,
            version: snap.template_version.clone(),
            rootfs: snap.rootfs.clone().into(),
        };
        if !template.rootfs.is_dir() {
            return Err(CoreError::Conflict(format!(
                "the rootfs snapshot {snapshot_id} was taken on is gone"
            )));
        }
        // A files-only snapshot starts from the template (its checkpoint
        // when this host has one for the recorded version) and the files.
        let (image, files, mode): (Option<PathBuf>, Option<PathBuf>, &'static str) = match snap.kind
        {
            SnapshotKind::Memory => (Some(dir), None, "fork"),
            SnapshotKind::Files => (
                self.template_image(&template),
                Some(dir.join(FILES_ARCHIVE)),
                "files",
            ),
        };
        Ok(ForkSource {
            template,
            image,
            files,
            mode,
        })
    }

    pub(crate) async fn expire_snapshots(&self) {
        let now = now_ms();
        let ids = match self.store.expired_snapshots(self.host_id(), now).await {
            Ok(mut ids) if self.snapshots.has_shared() => {
                // Every host sweeps the shared ones too; the row delete
                // picks the one that removes the files.
                self.store
                    .expired_shared_snapshots(now)
                    .await
                    .map(|shared| {
                        ids.extend(shared);
                        ids
                    })
            }
            other => other,
        };
        match ids {
            Ok(ids) => {
                for id in ids {
                    if let Err(e) = self.delete_snapshot(&id).await {
                        tracing::warn!(snapshot = %id, error = %e, "could not delete expired snapshot");
                    }
                }
            }
            Err(e) => tracing::error!(error = %e, "could not read snapshot retention"),
        }
        self.remove_shared_orphans().await;
    }

    /// Shared images without a row, published long enough ago that their
    /// row can no longer be on its way (a row is inserted right after its
    /// image is published): what a host that crashed between a row
    /// delete and the file removal left. Several hosts may do this at
    /// once; a remove is safe to race.
    async fn remove_shared_orphans(&self) {
        let Some(shared) = self.snapshots.orphan_sweep_due() else {
            return;
        };
        let stale = hatchery_templates::snapshot_store::STALE_AFTER;
        for id in shared.published_before(stale) {
            match self.store.get_snapshot(&id).await {
                Ok(None) => match shared.remove(&id) {
                    Ok(()) => {
                        tracing::warn!(snapshot = %id, "removed a shared image without a row")
                    }
                    Err(e) => {
                        tracing::warn!(snapshot = %id, error = %e, "could not remove an orphaned shared image")
                    }
                },
                Ok(Some(_)) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "orphan sweep of the shared snapshot store stopped");
                    return;
                }
            }
        }
    }
}
