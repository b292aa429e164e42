//! Which snapshot store serves a snapshot: this host's directory for a
//! `local:<this host>` row, the store every host mounts for a `shared`
//! one. A host keeps its local directory after it switches to a shared
//! store, so the snapshots it took before stay usable.

use crate::store::SnapshotLocation;
use crate::template_images::image_err;
use crate::CoreError;
use hatchery_templates::snapshot_store::LocalSnapshots;
use hatchery_templates::{ImageStore, SnapshotStore, SnapshotStoreError, SnapshotStoreKind};
use std::sync::Arc;

pub(crate) struct SnapshotStores {
    local: Arc<dyn SnapshotStore>,
    /// Where new snapshots go when set.
    shared: Option<Arc<dyn SnapshotStore>>,
    /// When the shared store was last swept for orphans.
    orphan_sweep: std::sync::Mutex<Option<std::time::Instant>>,
}

/// How often a host looks for shared images without a row (a crash
/// between a shared snapshot's row delete and its file removal). Listing
/// a network directory is not free, so not on every reaper tick.
pub(crate) const ORPHAN_SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(600);

pub(crate) fn store_err(e: SnapshotStoreError) -> CoreError {
    match e {
        SnapshotStoreError::Image(e) => image_err(e),
        e => CoreError::Internal(e.to_string()),
    }
}

impl SnapshotStores {
    pub(crate) fn new(local: ImageStore, chosen: Option<Arc<dyn SnapshotStore>>) -> Self {
        SnapshotStores {
            local: Arc::new(LocalSnapshots::from_images(local)),
            shared: chosen.filter(|s| s.kind() == SnapshotStoreKind::Shared),
            orphan_sweep: Default::default(),
        }
    }

    pub(crate) fn has_shared(&self) -> bool {
        self.shared.is_some()
    }

    /// Where a snapshot taken now goes, and what its row records.
    pub(crate) fn for_new(&self, me: &str) -> (&dyn SnapshotStore, SnapshotLocation) {
        match &self.shared {
            Some(s) => (s.as_ref(), SnapshotLocation::Shared),
            None => (
                self.local.as_ref(),
                SnapshotLocation::Local { host: me.into() },
            ),
        }
    }

    /// The store holding a snapshot at `loc`, if this host can reach it.
    /// Routing sends a request to a host that can; this answers the rest
    /// (a host without the shared mount, a misrouted local one) with a
    /// clear 409 rather than a 404 for a snapshot that exists.
    pub(crate) fn for_row(
        &self,
        id: &str,
        loc: &SnapshotLocation,
        me: &str,
    ) -> Result<&dyn SnapshotStore, CoreError> {
        match loc {
            SnapshotLocation::Local { host } if host == me => Ok(self.local.as_ref()),
            SnapshotLocation::Local { host } => Err(CoreError::Conflict(format!(
                "snapshot {id} is on host {host}'s disk; send the request to that host"
            ))),
            SnapshotLocation::Shared => self.shared.as_deref().ok_or_else(|| {
                CoreError::Conflict(format!(
                    "snapshot {id} is in the shared snapshot store, which this host does not \
                     mount (start it with --snapshot-store shared:<dir>)"
                ))
            }),
        }
    }

    /// The shared store, when an orphan sweep is due (at most every
    /// [`ORPHAN_SWEEP_EVERY`]).
    pub(crate) fn orphan_sweep_due(&self) -> Option<&dyn SnapshotStore> {
        let shared = self.shared.as_deref()?;
        let mut last = self.orphan_sweep.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_some_and(|t| t.elapsed() < ORPHAN_SWEEP_EVERY) {
            return None;
        }
        *last = Some(std::time::Instant::now());
        Some(shared)
    }

    /// This host's directory (files of a snapshot without a row).
    pub(crate) fn local(&self) -> &dyn SnapshotStore {
        self.local.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hatchery_templates::SnapshotStoreSpec;

    /// A scratch directory, removed when the test ends.
    fn tmp(tag: &str) -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix(&format!("hx-core-ss-{tag}-"))
            .tempdir()
            .unwrap()
    }

    #[test]
    fn rows_resolve_to_the_store_that_holds_them() {
        let (d_dir, b_dir) = (tmp("a"), tmp("b"));
        let d = d_dir.path();
        let local = ImageStore::new(d.join("snapshots")).unwrap();
        let only_local = SnapshotStores::new(local.clone(), None);
        let (_, loc) = only_local.for_new("h1");
        let h1 = SnapshotLocation::Local { host: "h1".into() };
        assert_eq!(loc, h1);
        assert!(only_local.for_row("s", &loc, "h1").is_ok());
        let other = only_local.for_row("s", &loc, "h2").err().unwrap();
        assert!(other.to_string().contains("host h1's disk"), "{other}");
        let no_mount = only_local.for_row("s", &SnapshotLocation::Shared, "h1");
        assert!(matches!(no_mount.err(), Some(CoreError::Conflict(_))));

        let shared = SnapshotStoreSpec::Shared(b_dir.path().to_path_buf()).open(d);
        let both = SnapshotStores::new(local, Some(shared.unwrap()));
        assert!(both.has_shared());
        assert!(both.orphan_sweep_due().is_some());
        assert!(both.orphan_sweep_due().is_none(), "not again so soon");
        assert!(only_local.orphan_sweep_due().is_none());
        let (s, loc) = both.for_new("h1");
        assert_eq!(
            (s.kind(), loc.clone()),
            (SnapshotStoreKind::Shared, SnapshotLocation::Shared)
        );
        let kind = |loc, me| both.for_row("s", loc, me).unwrap().kind();
        assert_eq!(kind(&loc, "h9"), SnapshotStoreKind::Shared);
        // What it took before the switch stays reachable.
        assert_eq!(kind(&h1, "h1"), SnapshotStoreKind::Local);
    }
}
