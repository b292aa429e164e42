//! Warm pools of snapshot forks (snapshot_pool.rs) against the fake
//! runtime: refilled in the background, parked, claimed by a fork with
//! the fork's own deadline and metadata, independent, and stopped when
//! the snapshot is deleted or its pool set to 0.

use super::*;
use crate::snapshot_pool::key;

fn meta(k: &str, v: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(k.to_string(), v.to_string())])
}

#[tokio::test]
async fn a_warm_snapshot_s_forks_are_claimed_refilled_and_dropped_with_it() {
    let rig = Rig::new().await;
    let (m, _src, snap) = snapshotted(&rig).await;
    // No template pool: the snapshot's pool is filled all the same.
    assert_eq!(m.pool.cfg.size, 0);
    let info = m.set_snapshot_pool(&snap.id, 2).await.unwrap();
    assert_eq!((info.size, info.ready), (2, 0));
    let filler = m.spawn_pool_filler();
    eventually!("the pool fill", m.snapshot_pool(&snap.id).ready == 2);
    let pooled = m.pool.ids_of(&key(&snap.id));
    for id in &pooled {
        assert_eq!(rig.rt.is_parked(id), Some(true), "parked until claimed");
        assert!(rig.rt.was_restored(id), "restored from the snapshot");
    }
    assert_eq!(m.metrics.snapshot_pool_ready.get(), 2);
    assert_eq!(m.metrics.pool_ready.get(), 0, "templates' gauge apart");

    let req = ForkRequest {
        count: 1,
        ttl_seconds: Some(120),
        metadata: meta("session", "s1"),
        ..Default::default()
    };
    let a = m.fork(&snap.id, req.clone()).await.unwrap().remove(0);
    assert_eq!(a.boot_mode, Some("pool"));
    assert!(pooled.contains(&a.id), "a pooled fork, not a restore");
    assert_eq!(rig.rt.is_parked(&a.id), Some(false), "a claim thaws it");
    assert_eq!(rig.rt.expiry(&a.id), Some(a.expires_at_ms));
    let got = m.get(&a.id).await.unwrap();
    assert_eq!(
        (got.state.as_str(), got.metadata),
        ("running", meta("session", "s1"))
    );
    assert_eq!(m.read_file(&a.id, "/work/x").await.unwrap(), b"v1");
    assert_eq!(m.metrics.snapshot_pool_claims.get(), 1);

    // The other pooled fork is a sandbox of its own.
    let b = m.fork(&snap.id, req).await.unwrap().remove(0);
    assert_eq!(b.boot_mode, Some("pool"));
    assert_ne!(a.id, b.id);
    m.write_file(&a.id, "/work/x", b"a's").await.unwrap();
    assert_eq!(m.read_file(&b.id, "/work/x").await.unwrap(), b"v1");

    eventually!("the refill", m.snapshot_pool(&snap.id).ready == 2);
    let refilled = m.pool.ids_of(&key(&snap.id));
    assert!(refilled.iter().all(|id| !pooled.contains(id)));

    // Deleting the snapshot drops its pool: the parked forks are stopped
    // and torn down; the claimed ones are the callers' and stay.
    assert_eq!(
        rig.store.snapshot_pools(m.host_id()).await.unwrap().len(),
        1
    );
    m.delete_snapshot(&snap.id).await.unwrap();
    // Forgotten by the store too: a restart does not try to fill it.
    assert!(rig
        .store
        .snapshot_pools(m.host_id())
        .await
        .unwrap()
        .is_empty());
    eventually!("the drop", m.pool.len(&key(&snap.id)) == 0);
    eventually!(
        "the teardown",
        refilled.iter().all(|id| !rig.rt.ids().contains(id))
    );
    for id in &refilled {
        assert_eq!(rig.stop_reason(id).await.as_deref(), Some("pool_discard"));
    }
    assert_eq!(m.metrics.snapshot_pool_ready.get(), 0);
    assert_eq!(m.get(&a.id).await.unwrap().state, "running");
    filler.abort();
}

#[tokio::test]
async fn size_zero_drops_the_pool_and_an_unwanted_snapshot_forks_by_restoring() {
    let rig = Rig::new().await;
    let (m, _src, snap) = snapshotted(&rig).await;
    let f = m.fork(&snap.id, fork_req(1)).await.unwrap().remove(0);
    assert_eq!(f.boot_mode, Some("fork"), "never asked to be warm");
    assert_eq!(m.metrics.snapshot_pool_misses.get(), 0);

    m.set_snapshot_pool(&snap.id, 1).await.unwrap();
    // A fork before the refill finds none: it restores, and counts a miss.
    let f = m.fork(&snap.id, fork_req(1)).await.unwrap().remove(0);
    assert_eq!(f.boot_mode, Some("fork"));
    assert_eq!(m.metrics.snapshot_pool_misses.get(), 1);

    let filler = m.spawn_pool_filler();
    eventually!("the pool fill", m.snapshot_pool(&snap.id).ready == 1);
    let parked = m.pool.ids_of(&key(&snap.id));
    let info = m.set_snapshot_pool(&snap.id, 0).await.unwrap();
    assert_eq!((info.size, info.ready), (0, 0));
    eventually!(
        "the teardown",
        parked.iter().all(|id| !rig.rt.ids().contains(id))
    );
    // And it stays dropped: no refill.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(m.pool.len(&key(&snap.id)), 0);
    filler.abort();

    assert!(m.set_snapshot_pool(&snap.id, 9).await.is_err(), "at most 8");
    assert!(matches!(
        m.set_snapshot_pool("snap_nope", 1).await,
        Err(CoreError::SnapshotNotFound(_))
    ));
}

#[tokio::test]
async fn shutdown_destroys_a_snapshot_s_parked_forks() {
    let rig = Rig::new().await;
    let (m, src, snap) = snapshotted(&rig).await;
    m.set_snapshot_pool(&snap.id, 1).await.unwrap();
    let filler = m.spawn_pool_filler();
    eventually!("the pool fill", m.snapshot_pool(&snap.id).ready == 1);
    filler.abort();
    let parked = m.pool.ids_of(&key(&snap.id));
    allow_bakes(&m);
    m.shutdown().await;
    assert_eq!(rig.rt.ids(), vec![src], "the pooled fork is gone");
    assert_eq!(
        rig.stop_reason(&parked[0]).await.as_deref(),
        Some("pool_discard")
    );
}

#[tokio::test]
async fn a_hot_pool_is_filled_again_after_a_restart_and_a_cold_one_forgotten() {
    use crate::snapshot_pool::HOT_FOR;
    let rig = Rig::new().await;
    let (old, _src, snap) = snapshotted(&rig).await;
    old.set_snapshot_pool(&snap.id, 2).await.unwrap();
    let me = old.host_id().to_string();
    // Another snapshot's pool, last asked for longer ago than HOT_FOR.
    let cold_at = now_ms() - HOT_FOR.as_millis() as u64 - 1_000;
    rig.store
        .set_snapshot_pool(&old.fence, "snap_cold", 1, cold_at)
        .await
        .unwrap();
    assert_eq!(rig.store.snapshot_pools(&me).await.unwrap().len(), 2);
    drop(old);

    let m = rig.manager().await;
    assert_eq!(m.snapshot_pool(&snap.id).size, 0, "not before reconcile");
    m.reconcile().await.unwrap();
    assert_eq!(m.snapshot_pool(&snap.id).size, 2);
    assert_eq!(m.snapshot_pool("snap_cold").size, 0);
    let rows = rig.store.snapshot_pools(&me).await.unwrap();
    let kept: Vec<_> = rows.iter().map(|p| p.snapshot_id.as_str()).collect();
    assert_eq!(kept, [snap.id.as_str()], "the cold one is forgotten");
    let filler = m.spawn_pool_filler();
    eventually!("the pool refilled", m.snapshot_pool(&snap.id).ready == 2);
    let f = m.fork(&snap.id, fork_req(1)).await.unwrap().remove(0);
    assert_eq!(f.boot_mode, Some("pool"));
    // Set to 0: forgotten, so the next restart does not fill it.
    m.set_snapshot_pool(&snap.id, 0).await.unwrap();
    assert!(rig.store.snapshot_pools(&me).await.unwrap().is_empty());
    filler.abort();
}
