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
        template_version: String::new(),
        rootfs: String::new(),
        limits: String::new(),
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
        environments: None,
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

#[tokio::test]
async fn a_starting_host_is_not_routed_to_and_a_held_one_takes_nothing_new() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir).await;
    let f = host(s.as_ref(), "h1", 60_000).await;
    s.insert_sandbox(&f, &sbx("sbx_remote")).await.unwrap();
    let d = directory(&s, 60_000);
    // Restarted: registered again, not yet ready.
    let f2 = Fence::of(
        &s.take_lease(&host_resource("h1"), "h1", 60_000)
            .await
            .unwrap(),
    );
    s.register_host(&f2, "10.0.0.1:7002", 8, "test")
        .await
        .unwrap();
    assert_eq!(
        d.sandbox("sbx_remote").await.unwrap(),
        Location::Starting { host: "h1".into() }
    );
    let h = &d.hosts().await.unwrap()[0];
    assert_eq!((h.alive, h.routed, h.placeable), (true, false, false));
    assert!(s.host_ready(&f2).await.unwrap());
    assert!(matches!(
        d.sandbox("sbx_remote").await.unwrap(),
        Location::At { .. }
    ));
    // Cordoned: still routed, not placeable.
    assert!(s
        .hold_host(
            "h1",
            &[hatchery_store::HostHold::None],
            hatchery_store::HostHold::Cordoned
        )
        .await
        .unwrap());
    assert!(matches!(
        d.sandbox("sbx_remote").await.unwrap(),
        Location::At { .. }
    ));
    let h = &d.hosts().await.unwrap()[0];
    assert_eq!((h.alive, h.routed, h.placeable), (true, true, false));
}

#[tokio::test]
async fn a_sandbox_of_a_lost_host_says_when_and_why() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir).await;
    let lost = host(s.as_ref(), "h1", 100).await;
    s.insert_sandbox(&lost, &sbx("sbx_gone000000000000"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(sweep(s.as_ref(), 200, None).await.unwrap(), 1);
    let d = directory(&s, 200);
    match d.sandbox("sbx_gone000000000000").await.unwrap() {
        Location::Gone {
            host,
            at_ms,
            reason,
        } => {
            assert_eq!(host, "h1");
            assert!(at_ms > 1_600_000_000_000, "{at_ms}");
            assert!(reason.contains(LOST_REASON), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    // Stopped for another reason: unknown as before.
    let f = host(s.as_ref(), "h2", 60_000).await;
    s.insert_sandbox(&f, &sbx("sbx_de1eted000000000"))
        .await
        .unwrap();
    assert!(s
        .stop(&f, "sbx_de1eted000000000", "deleted", 1)
        .await
        .unwrap());
    assert_eq!(
        d.sandbox("sbx_de1eted000000000").await.unwrap(),
        Location::Unknown
    );
}

mod api {
    use super::*;
    use crate::api::{router, HostsApi};
    use crate::sessions_count::fake::FixedCounts;
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use tower::ServiceExt;

    async fn call(
        app: &axum::Router,
        method: &str,
        path: &str,
        key: &str,
    ) -> (StatusCode, serde_json::Value) {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("authorization", format!("Bearer {key}"))
            .body(Body::empty())
            .unwrap();
        let resp = app.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, serde_json::from_slice(&body).unwrap_or_default())
    }

    #[tokio::test]
    async fn hosts_are_listed_cordoned_drained_and_uncordoned() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(&dir).await;
        let f = host(s.as_ref(), "h1", 60_000).await;
        s.insert_sandbox(&f, &sbx("sbx_1")).await.unwrap();
        let app = router(HostsApi {
            store: s.clone(),
            lease_ttl_ms: 60_000,
            api_key: "k".into(),
            sessions: Some(Arc::new(FixedCounts([("h1".to_string(), 2)].into()))),
        });
        let (st, _) = call(&app, "GET", "/v1/hosts", "wrong").await;
        assert_eq!(st, StatusCode::UNAUTHORIZED);
        let (st, v) = call(&app, "GET", "/v1/hosts", "k").await;
        assert_eq!(st, StatusCode::OK);
        let h = &v["hosts"][0];
        assert_eq!(h["id"], "h1");
        assert_eq!(h["state"], "ready");
        assert_eq!(h["live_sandboxes"], 1);
        assert_eq!(h["live_sessions"], 2);
        assert_eq!(h["capacity"], 8);
        assert_eq!(h["version"], "test");
        assert!(h["heartbeat_age_ms"].as_u64().unwrap() < 60_000);

        let (st, v) = call(&app, "POST", "/v1/hosts/h1:cordon", "k").await;
        assert_eq!((st, &v["state"]), (StatusCode::OK, &"cordoned".into()));
        // Twice is no error.
        let (st, v) = call(&app, "POST", "/v1/hosts/h1:cordon", "k").await;
        assert_eq!((st, &v["state"]), (StatusCode::OK, &"cordoned".into()));
        let (_, v) = call(&app, "POST", "/v1/hosts/h1:drain", "k").await;
        assert_eq!(v["state"], "draining");
        // A drain is not walked back to a cordon: the hold stays.
        let (_, v) = call(&app, "POST", "/v1/hosts/h1:cordon", "k").await;
        assert_eq!(v["state"], "draining");
        let (_, v) = call(&app, "POST", "/v1/hosts/h1:uncordon", "k").await;
        assert_eq!(v["state"], "ready");
        let (_, v) = call(&app, "GET", "/v1/hosts/h1", "k").await;
        assert_eq!(v["state"], "ready");

        let (st, v) = call(&app, "GET", "/v1/hosts/nope", "k").await;
        assert_eq!(
            (st, &v["error"]["code"]),
            (StatusCode::NOT_FOUND, &"host_not_found".into())
        );
        let (st, v) = call(&app, "POST", "/v1/hosts/nope:cordon", "k").await;
        assert_eq!(
            (st, &v["error"]["code"]),
            (StatusCode::NOT_FOUND, &"host_not_found".into())
        );
        let (st, v) = call(&app, "POST", "/v1/hosts/h1:reboot", "k").await;
        assert_eq!(
            (st, &v["error"]["code"]),
            (StatusCode::BAD_REQUEST, &"invalid_request".into())
        );
        let (st, _) = call(&app, "POST", "/v1/hosts/Bad%20Id:cordon", "k").await;
        assert_eq!(st, StatusCode::BAD_REQUEST);
    }

    #[tokio::test]
    async fn the_control_plane_is_ready_with_a_ready_host_and_counts_hosts_by_state() {
        use crate::readiness::{ControlChecks, ReadyChecks};
        let dir = tempfile::tempdir().unwrap();
        let s = store(&dir).await;
        let checks = ReadyChecks {
            host: None,
            control: Some(ControlChecks {
                store: s.clone(),
                lease_ttl_ms: 60_000,
            }),
        };
        let (st, r) = checks.run().await;
        assert_eq!(
            (st, r.failing),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                vec!["ready_host".to_string()]
            )
        );
        let f = host(s.as_ref(), "h1", 60_000).await;
        assert_eq!(checks.run().await.0, StatusCode::OK);
        // Cordoned is not ready.
        s.hold_host(
            "h1",
            &[hatchery_store::HostHold::None],
            hatchery_store::HostHold::Cordoned,
        )
        .await
        .unwrap();
        assert_eq!(checks.run().await.0, StatusCode::SERVICE_UNAVAILABLE);

        let reg = prometheus::Registry::new();
        let g = crate::gauges::HostGauges::new(&reg);
        s.insert_sandbox(&f, &sbx("sbx_g")).await.unwrap();
        let counts = super::Fixed([("h1".to_string(), 3)].into());
        g.refresh(s.as_ref(), Some(&counts), 60_000).await.unwrap();
        assert_eq!(g.by_state.with_label_values(&["cordoned"]).get(), 1);
        assert_eq!(g.by_state.with_label_values(&["ready"]).get(), 0);
        assert_eq!(g.live.with_label_values(&["h1"]).get(), 1);
        assert_eq!(g.sessions.with_label_values(&["h1"]).get(), 3);
        let cap = s.list_hosts().await.unwrap()[0].capacity as i64;
        assert_eq!(g.capacity.with_label_values(&["h1"]).get(), cap);
        let text = prometheus::TextEncoder::new()
            .encode_to_string(&reg.gather())
            .unwrap();
        assert!(
            text.contains("hatchery_host_live_sessions{host=\"h1\"} 3"),
            "{text}"
        );
    }
}

/// Fixed session counts per host.
struct Fixed(std::collections::BTreeMap<String, u32>);

#[async_trait::async_trait]
impl crate::sessions_count::SessionCounts for Fixed {
    async fn per_host(
        &self,
    ) -> Result<std::collections::BTreeMap<String, u32>, hatchery_sessions::store::StoreError> {
        Ok(self.0.clone())
    }
}

/// The heartbeat names a snapshot's warm pool by hatchery-core's pool key,
/// and placement looks for hatchery-route's key: one string, two crates.
#[test]
fn a_warm_pool_is_named_the_same_by_heartbeat_and_placement() {
    assert_eq!(
        hatchery_core::snapshot_pool::key("sn_x"),
        hatchery_route::placement::snapshot_key("sn_x")
    );
}

#[tokio::test]
async fn an_environment_is_placed_by_its_current_versions_snapshot() {
    use hatchery_sessions::environments::models::{BuildReason, EnvSpec};
    use hatchery_sessions::environments::store::{EnvStore, NewVersion};
    let dir = tempfile::tempdir().unwrap();
    let db = Db::sqlite(&dir.path().join("hatchery.db")).await.unwrap();
    let s: Arc<dyn Store> = Arc::new(DbStore::open(db.clone()).await.unwrap());
    let envs = EnvStore::open(db).await.unwrap();
    let spec: EnvSpec = serde_json::from_value(serde_json::json!({
        "repo": "git://127.0.0.1/r", "ref": "main", "template": "code-interpreter",
        "setup": "true", "setup_allow": [], "setup_timeout_s": 60
    }))
    .unwrap();
    envs.insert("env_a", "a", &spec, None).await.unwrap();
    let mut d = directory(&s, 10_000);
    // Without the environments' tables: no preference.
    assert_eq!(d.environment_snapshot("env_a").await.unwrap(), None);
    d.environments = Some(envs.clone());
    // Not built yet, and unknown.
    assert_eq!(d.environment_snapshot("env_a").await.unwrap(), None);
    assert_eq!(d.environment_snapshot("env_zz").await.unwrap(), None);
    for snap in ["snp_1", "snp_2"] {
        let v = NewVersion {
            snapshot_id: snap,
            base_commit: "c0ffee",
            template: "code-interpreter",
            template_version: None,
            reason: BuildReason::Requested,
            build_ms: 1,
        };
        envs.add_version("env_a", v).await.unwrap().unwrap();
        // The current version's, which a rebuild replaces.
        assert_eq!(
            d.environment_snapshot("env_a").await.unwrap().as_deref(),
            Some(snap)
        );
    }
}
