//! The directory and the sweeper on a real SQLite store in a temp dir
//! (cheap, and the heartbeat ages come from its clock as in production),
//! with the local manager and the sessions takeover faked.

use crate::local::fake::FakeLocal;
use crate::sweeper::{sweep, LOST_REASON};
use crate::takeover::fake::FakeTakeover;
use crate::StoreDirectory;
use hatchery_db::Db;
use hatchery_route::{Directory, Location};
use hatchery_store::{host_resource, DbStore, Fence, SandboxRow, SandboxState, Store};
use std::sync::Arc;
use std::time::Duration;

async fn store(dir: &tempfile::TempDir) -> Arc<dyn Store> {
    let db = Db::sqlite(&dir.path().join("hatchery.db")).await.unwrap();
    Arc::new(DbStore::open(db).await.unwrap())
}

/// A host that took its lease for `lease_ms`, registered and beat once.
async fn host(s: &dyn Store, id: &str, lease_ms: u64) -> Fence {
    let f = Fence::of(
        &s.take_lease(&host_resource(id), id, lease_ms)
            .await
            .unwrap(),
    );
    s.register_host(&f, &format!("10.0.0.1:{}", 7000 + id.len()), 8, "test")
        .await
        .unwrap();
    assert!(s.host_ready(&f).await.unwrap());
    assert!(s.heartbeat(&f, 0, &[]).await.unwrap());
    f
}

fn sbx(id: &str) -> SandboxRow {
    SandboxRow {
        id: id.into(),
        template: "base".into(),
        state: SandboxState::Running,
        created_at_ms: 1,
        expires_at_ms: u64::MAX / 4,
        metadata: Default::default(),
        env: Default::default(),
        host_id: String::new(),
    }
}

fn directory(store: &Arc<dyn Store>, lease_ttl_ms: u64) -> StoreDirectory {
    StoreDirectory {
        store: store.clone(),
        me: "me".into(),
        lease_ttl_ms,
        local: Some(Arc::new(FakeLocal {
            running: vec!["sbx_local".into()],
            shared_snapshots: false,
        })),
        sessions: None,
    }
}

#[test]
fn alive_up_to_the_ttl() {
    assert!(crate::alive(0, 10_000));
    assert!(crate::alive(10_000, 10_000));
    assert!(!crate::alive(10_001, 10_000));
}

#[tokio::test]
async fn a_host_is_alive_or_lost_by_its_heartbeat_age() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir).await;
    let f = host(s.as_ref(), "h1", 60_000).await;
    s.insert_sandbox(&f, &sbx("sbx_remote")).await.unwrap();

    let fresh = directory(&s, 60_000);
    assert_eq!(
        fresh.sandbox("sbx_remote").await.unwrap(),
        Location::At {
            host: "h1".into(),
            url: "http://10.0.0.1:7002".into()
        }
    );
    // Answered from the local manager, without a row.
    assert_eq!(fresh.sandbox("sbx_local").await.unwrap(), Location::Here);
    assert_eq!(fresh.sandbox("nothing").await.unwrap(), Location::Unknown);
    let hosts = fresh.hosts().await.unwrap();
    assert_eq!(hosts.len(), 1);
    assert!(hosts[0].alive);
    assert_eq!((hosts[0].live, hosts[0].capacity), (1, 8));

    // The same heartbeat, older than a shorter TTL: lost.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let strict = directory(&s, 10);
    assert_eq!(
        strict.sandbox("sbx_remote").await.unwrap(),
        Location::Lost { host: "h1".into() }
    );
    assert!(!strict.hosts().await.unwrap()[0].alive);
    // A new heartbeat makes it alive again.
    assert!(s.heartbeat(&f, 1, &[]).await.unwrap());
    let ttl_1s = directory(&s, 1_000);
    assert!(ttl_1s.hosts().await.unwrap()[0].alive);
}

#[tokio::test]
async fn the_sweeper_stops_a_lost_hosts_rows_and_takes_its_sessions_over() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir).await;
    // h1's lease runs out and its heartbeat ages; h2 holds a long lease.
    let lost = host(s.as_ref(), "h1", 100).await;
    for id in ["sbx_a", "sbx_b"] {
        s.insert_sandbox(&lost, &sbx(id)).await.unwrap();
    }
    let kept = host(s.as_ref(), "h2", 60_000).await;
    s.insert_sandbox(&kept, &sbx("sbx_c")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(s.heartbeat(&kept, 1, &[]).await.unwrap());

    let takeover = FakeTakeover::default();
    let ttl = 200;
    assert_eq!(sweep(s.as_ref(), ttl, Some(&takeover)).await.unwrap(), 2);
    assert!(s.list_unstopped("h1").await.unwrap().is_empty());
    assert!(s.get_live("sbx_a").await.unwrap().is_none());
    let events = s.events("sbx_a").await.unwrap();
    assert!(
        events
            .iter()
            .any(|e| e.kind == "stopped" && e.detail == LOST_REASON),
        "{events:?}"
    );
    assert!(s.get_live("sbx_c").await.unwrap().is_some());
    assert_eq!(*takeover.asked.lock().unwrap(), vec!["h1".to_string()]);

    // Nothing left to stop; the takeover is asked again (it is idempotent,
    // and a failed one is retried this way), and its failure is no error.
    let failing = FakeTakeover {
        fail: true,
        ..FakeTakeover::default()
    };
    assert_eq!(sweep(s.as_ref(), ttl, Some(&failing)).await.unwrap(), 0);
    assert_eq!(*failing.asked.lock().unwrap(), vec!["h1".to_string()]);
    // Without sessions (the control role) only rows are stopped.
    assert_eq!(sweep(s.as_ref(), ttl, None).await.unwrap(), 0);
}
