//! Warm pools of forks (issue 40): for a snapshot someone asked to keep
//! warm (`PUT /v1/snapshots/{id}/pool`; the sessions service does it for
//! a hot environment version), a few sandboxes already restored from it,
//! parked exactly like a template's pool (pool.rs): a fork claims one
//! instead of verifying and restoring the image. They sit in the same
//! [`crate::pool::WarmPool`] under [`key`], so stops, memory-pressure
//! drains, lease loss and shutdown reach them as they reach a template's.
//!
//! A pool goes when its size is set to 0, when the snapshot is deleted,
//! and when nobody forked from it or asked for it for [`HOT_FOR`]: the
//! filler stops whatever is pooled under a key nobody wants any more, so
//! a refill that raced a drop is cleaned up on the next tick.

use crate::ids::new_sandbox_id;
use crate::store::{SandboxRow, SandboxState, SnapshotRow};
use crate::{now_ms, CoreError, ForkRequest, Manager, SandboxInfo};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Forks kept ready per snapshot, at most (each costs an idle sandbox's
/// memory; the pool's memory budget, shared with templates, caps them all).
pub const MAX_SIZE: usize = 8;

/// A pool nobody forked from nor asked for this long is dropped: a
/// version that stopped being used (superseded, or its environment gone
/// quiet) must not hold memory for ever, even when nobody says so.
pub const HOT_FOR: Duration = Duration::from_secs(15 * 60);

const PREFIX: &str = "snapshot:";

/// The pool key of `snapshot`'s forks (template names have no colon).
/// Also how the heartbeat names a snapshot with a warm pool here, which
/// placement matches (`hatchery_route::placement::snapshot_key`; a test in
/// hatchery-hosts holds them equal).
pub fn key(snapshot: &str) -> String {
    format!("{PREFIX}{snapshot}")
}

/// The snapshot a pool key is for; `None` for a template's key.
pub fn snapshot_of(key: &str) -> Option<&str> {
    key.strip_prefix(PREFIX)
}

/// A snapshot's warm pool as the API shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotPoolInfo {
    pub snapshot_id: String,
    /// Forks kept ready (0: no pool).
    pub size: usize,
    /// Forks ready now.
    pub ready: usize,
    /// Their sandbox ids (parked; not listed among the sandboxes until
    /// claimed): for the operator and the tests' teardown checks.
    pub sandbox_ids: Vec<String>,
}

#[derive(Debug, Clone, Copy)]
struct Want {
    size: usize,
    touched: Instant,
}

/// Which snapshots are kept warm, and how many forks each.
#[derive(Default)]
pub struct Wanted(Mutex<HashMap<String, Want>>);

impl Wanted {
    fn with<T>(&self, f: impl FnOnce(&mut HashMap<String, Want>) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Keeps `size` forks of `snapshot` ready (0 drops the pool).
    pub fn set(&self, snapshot: &str, size: usize, now: Instant) {
        self.with(|m| {
            if size == 0 {
                m.remove(snapshot);
            } else {
                m.insert(snapshot.to_string(), Want { size, touched: now });
            }
        })
    }

    /// A fork of `snapshot`: still hot. True when it is kept warm.
    pub fn touch(&self, snapshot: &str) -> bool {
        self.touch_at(snapshot, Instant::now())
    }

    fn touch_at(&self, snapshot: &str, now: Instant) -> bool {
        self.with(|m| match m.get_mut(snapshot) {
            Some(w) => {
                w.touched = now;
                true
            }
            None => false,
        })
    }

    pub fn size(&self, snapshot: &str) -> usize {
        self.with(|m| m.get(snapshot).map_or(0, |w| w.size))
    }

    pub fn remove(&self, snapshot: &str) -> bool {
        self.with(|m| m.remove(snapshot).is_some())
    }

    /// Drops the pools cold at `now` (untouched for [`HOT_FOR`]) and
    /// returns the rest: (snapshot, size), in a stable order.
    pub fn due(&self, now: Instant) -> Vec<(String, usize)> {
        self.with(|m| {
            m.retain(|_, w| now.saturating_duration_since(w.touched) < HOT_FOR);
            let mut v: Vec<_> = m.iter().map(|(k, w)| (k.clone(), w.size)).collect();
            v.sort();
            v
        })
    }
}

/// Which pools to refill now: each one short of its size gets one fork
/// this round (a round is one filler tick), while the memory budget
/// (`room` more idle sandboxes) lasts. Pure, for the unit tests.
pub fn refills(due: &[(String, usize)], ready: impl Fn(&str) -> usize, room: usize) -> Vec<String> {
    due.iter()
        .filter(|(s, size)| ready(s) < *size)
        .map(|(s, _)| s.clone())
        .take(room)
        .collect()
}

impl Manager {
    /// Keeps `size` forks of snapshot `id` restored and parked on this
    /// host (0 drops them). The snapshot must be one this host can fork.
    pub async fn set_snapshot_pool(
        self: &Arc<Self>,
        id: &str,
        size: usize,
    ) -> Result<SnapshotPoolInfo, CoreError> {
        if size > MAX_SIZE {
            return Err(CoreError::Invalid(format!(
                "size must be between 0 and {MAX_SIZE}"
            )));
        }
        let snap = self
            .store
            .get_snapshot(id)
            .await?
            .ok_or_else(|| CoreError::SnapshotNotFound(id.into()))?;
        // Refused now rather than by every refill: a snapshot of another
        // host's local store (without a shared one) cannot be restored here.
        self.snapshots.for_row(id, &snap.location, self.host_id())?;
        // Remembered first, so a restart while it is hot fills it again.
        self.store
            .set_snapshot_pool(&self.fence, id, size as u32, now_ms())
            .await?;
        self.snapshot_pools.set(id, size, Instant::now());
        if size == 0 {
            self.drop_snapshot_pool(id).await;
        } else {
            // A smaller size: the extra forks go now.
            let extra = self.pool.ids_of(&key(id)).into_iter().skip(size);
            for sbx in extra.collect::<Vec<_>>() {
                self.stop(&sbx, "pool_discard").await;
            }
        }
        tracing::info!(snapshot = %id, size, "snapshot pool set");
        Ok(self.snapshot_pool(id))
    }

    /// What the heartbeat reports as warm here: templates whose
    /// checkpoint is sealed on this disk, and the pool key ([`key`]) of
    /// each snapshot with forks parked in its warm pool, so placement
    /// sends that snapshot's forks to this host first (a claim is 1-2 ms;
    /// a restore elsewhere about 200).
    pub fn warm_keys(&self) -> Vec<String> {
        let mut keys = self.warm_templates();
        keys.extend(
            self.pool
                .keys()
                .into_iter()
                .filter(|k| snapshot_of(k).is_some()),
        );
        keys.sort();
        keys.dedup();
        keys
    }

    pub fn snapshot_pool(&self, id: &str) -> SnapshotPoolInfo {
        let sandbox_ids = self.pool.ids_of(&key(id));
        SnapshotPoolInfo {
            snapshot_id: id.to_string(),
            size: self.snapshot_pools.size(id),
            ready: sandbox_ids.len(),
            sandbox_ids,
        }
    }

    /// No more forks of `id` kept; the parked ones are stopped.
    pub(crate) async fn drop_snapshot_pool(self: &Arc<Self>, id: &str) {
        self.snapshot_pools.remove(id);
        self.forget_snapshot_pool(id).await;
        for sbx in self.pool.ids_of(&key(id)) {
            self.stop(&sbx, "pool_discard").await;
        }
    }

    /// Removes `id`'s pool from the store's record of this host's pools.
    pub(crate) async fn forget_snapshot_pool(&self, id: &str) {
        if let Err(e) = self
            .store
            .set_snapshot_pool(&self.fence, id, 0, now_ms())
            .await
        {
            tracing::warn!(snapshot = %id, error = %e, "could not forget a snapshot pool in the store; a restart drops it as cold");
        }
    }

    /// After a restart (reconcile): the snapshot pools this host kept and
    /// that are still hot (asked for within [`HOT_FOR`]) are wanted again,
    /// for what is left of their time, so the filler restores them before
    /// the next session asks; cold ones are forgotten. Their parked forks
    /// went with the old process.
    pub(crate) async fn restore_snapshot_pools(&self) {
        let rows = match self.store.snapshot_pools(self.host_id()).await {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(error = %e, "could not read this host's snapshot pools; they fill again when asked");
                return;
            }
        };
        let (now, wall) = (Instant::now(), now_ms());
        let mut kept = 0;
        for p in rows {
            let age = Duration::from_millis(wall.saturating_sub(p.touched_at_ms));
            if p.size == 0 || age >= HOT_FOR {
                self.forget_snapshot_pool(&p.snapshot_id).await;
                continue;
            }
            let touched = now.checked_sub(age).unwrap_or(now);
            let size = (p.size as usize).min(MAX_SIZE);
            self.snapshot_pools.set(&p.snapshot_id, size, touched);
            kept += 1;
        }
        if kept > 0 {
            tracing::info!(pools = kept, "snapshot pools kept across the restart");
        }
    }

    /// One fork of `snap` from its warm pool, made the caller's; `None`
    /// when none is ready (or every one ready turned out dead).
    pub(crate) async fn claim_warm_fork(
        self: &Arc<Self>,
        snap: &SnapshotRow,
        ttl: u64,
        req: &ForkRequest,
    ) -> Result<Option<SandboxInfo>, CoreError> {
        let k = key(&snap.id);
        while let Some((id, client)) = self.pool.take(&k) {
            let started = Instant::now();
            let row = self.fork_row(snap, id, SandboxState::Running, ttl, req);
            if let Some(mut info) = self
                .claim_pooled(&row, &req.network, client, started)
                .await?
            {
                self.metrics.snapshot_pool_claims.inc();
                info.boot_mode = Some("pool");
                return Ok(Some(info));
            }
        }
        Ok(None)
    }

    /// The filler's round for snapshots (pool.rs): stops forks nobody
    /// wants any more, then restores one more fork of each warm snapshot
    /// short of its size, within the memory budget.
    pub(crate) async fn fill_snapshot_pools(self: &Arc<Self>) {
        let due = self.snapshot_pools.due(Instant::now());
        for k in self.pool.keys() {
            let Some(snap) = snapshot_of(&k) else {
                continue;
            };
            let size = due.iter().find(|(s, _)| s == snap).map_or(0, |(_, n)| *n);
            for sbx in self.pool.ids_of(&k).into_iter().skip(size) {
                tracing::info!(snapshot = %snap, sandbox = %sbx, "snapshot pool: not wanted any more");
                self.stop(&sbx, "pool_discard").await;
            }
        }
        let room = self.pool.budget().saturating_sub(self.pool.total());
        for snap in refills(&due, |s| self.pool.len(&key(s)), room) {
            if self.closing.load(std::sync::atomic::Ordering::SeqCst) {
                return;
            }
            if let Err(e) = self.add_pooled_fork(&snap).await {
                tracing::warn!(snapshot = %snap, error = %e, "snapshot pool refill failed; dropping the pool");
                // A snapshot that cannot be restored (deleted, corrupt,
                // its rootfs gone) would fail every tick.
                self.drop_snapshot_pool(&snap).await;
            }
        }
    }

    async fn add_pooled_fork(self: &Arc<Self>, id: &str) -> Result<(), CoreError> {
        let snap = self
            .store
            .get_snapshot(id)
            .await?
            .ok_or_else(|| CoreError::SnapshotNotFound(id.into()))?;
        let src = self.fork_source(&snap)?;
        let now = now_ms();
        let row = SandboxRow {
            id: new_sandbox_id(),
            template: snap.template.clone(),
            state: SandboxState::Pooled,
            created_at_ms: now,
            expires_at_ms: now + self.pool.cfg.max_age.as_millis() as u64,
            metadata: BTreeMap::new(),
            env: snap.env.clone(),
            host_id: self.host_id().to_string(),
            template_version: snap.template_version.clone(),
            rootfs: snap.rootfs.clone(),
            limits: snap.limits.clone(),
        };
        // Deny-all until claimed, as a template's pooled sandbox.
        let client = self
            .start_row(
                &row,
                &Default::default(),
                &src.template,
                src.image.as_deref(),
                src.files.as_deref(),
            )
            .await?;
        if !self.still_pooled(&row.id).await? {
            return Ok(());
        }
        if self.snapshot_pools.size(id) == 0 {
            // The pool was dropped (or the snapshot deleted) meanwhile.
            drop(client);
            self.stop(&row.id, "pool_discard").await;
            return Ok(());
        }
        self.runtime.park(&row.id).await;
        self.pool.put(&key(id), row.id, client);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_told_apart_from_templates() {
        assert_eq!(snapshot_of(&key("snap_a")), Some("snap_a"));
        assert_eq!(snapshot_of("code-interpreter"), None);
    }

    #[test]
    fn a_pool_nobody_uses_goes_cold_and_a_fork_keeps_it_hot() {
        let w = Wanted::default();
        let t0 = Instant::now();
        w.set("a", 2, t0);
        w.set("b", 1, t0);
        assert!(!w.touch_at("c", t0), "never asked for: not warm");
        let later = t0 + HOT_FOR - Duration::from_secs(1);
        assert!(w.touch_at("a", later));
        let cold = t0 + HOT_FOR + Duration::from_secs(1);
        assert_eq!(w.due(cold), vec![("a".to_string(), 2)]);
        assert_eq!(w.size("b"), 0, "b went cold and was dropped");
        w.set("a", 0, cold);
        assert!(w.due(cold).is_empty());
    }

    #[test]
    fn refills_one_per_short_pool_within_the_budget() {
        let due = vec![
            ("a".to_string(), 2),
            ("b".to_string(), 1),
            ("c".to_string(), 3),
        ];
        let ready = |s: &str| match s {
            "a" => 1,
            "b" => 1,
            _ => 0,
        };
        assert_eq!(refills(&due, ready, 10), vec!["a", "c"]);
        assert_eq!(refills(&due, ready, 1), vec!["a"]);
        assert!(refills(&due, ready, 0).is_empty());
    }
}
