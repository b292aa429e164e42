//! Starting the broker: what the daemon's settings become, and the control
//! role's routes over an in-memory database (its owners and hosts fakes).

use super::*;
use crate::session_log::remote::tests::Owners;
use axum::body::Body;
use hatchery_route::fake::{slot, FixedHosts};
use tower::ServiceExt;

fn args() -> BrokerArgs {
    BrokerArgs {
        guest_port: 9200,
        git_push_urls: vec![],
        git_credential_file: None,
        git_credential_hosts: vec![],
        github_api: None,
        github_token_file: None,
        ca_file: None,
        anchor_interval_s: 0,
        anchor_hook: None,
        anchor_file: None,
        anchor_s3_url: None,
        anchor_s3_region: "us-east-1".into(),
        anchor_s3_credentials_file: None,
        anchor_s3_ca_file: None,
        mcp_config: None,
        control_url: None,
        for_hosts: true,
        session_max_calls: 1000,
        session_calls_per_minute: 120,
        session_max_arg_bytes: 16 << 20,
    }
}

fn settings<'a>(
    broker: &'a BrokerArgs,
    db: &'a hatchery_db::Db,
    data: &'a Path,
    registry: &'a prometheus::Registry,
) -> Settings<'a> {
    Settings {
        broker,
        max_open_approvals: 3,
        listen: "0.0.0.0:7423".parse().unwrap(),
        api_key: "hx_k",
        daemon_key: "hxd_d",
        host_id: "h1",
        data,
        db,
        registry,
    }
}

#[test]
fn the_own_api_is_reached_on_loopback_when_listening_on_all() {
    assert_eq!(
        own_api_url("0.0.0.0:7423".parse().unwrap()),
        "http://127.0.0.1:7423"
    );
    assert_eq!(
        own_api_url("10.0.0.5:7423".parse().unwrap()),
        "http://10.0.0.5:7423"
    );
    assert_eq!(
        socket_path(Path::new("/d")),
        PathBuf::from("/d/broker.sock")
    );
}

#[test]
fn the_sessions_cap_on_open_approvals_is_the_brokers() {
    let (db, dir, reg) = (
        hatchery_db::Db::sqlite_memory().unwrap(),
        tempfile::tempdir().unwrap(),
        prometheus::Registry::new(),
    );
    let a = args();
    let cfg = config(&settings(&a, &db, dir.path(), &reg)).unwrap();
    assert_eq!(cfg.caps.max_open_approvals, 3);
    assert_eq!(cfg.caps.max_calls, 1000);
    let bad = BrokerArgs {
        git_push_urls: vec!["nope".into()],
        ..args()
    };
    let e = config(&settings(&bad, &db, dir.path(), &reg)).unwrap_err();
    assert!(matches!(e, ConfigError::PushUrl(_)), "{e}");
}

async fn control(s: &Settings<'_>) -> Result<axum::Router, EmbedError> {
    let sessions = hatchery_sessions::store::DbSessionStore::open(s.db.clone(), "ctl")
        .await
        .unwrap();
    let policies = hatchery_policy::DbPolicyStore::open(s.db.clone())
        .await
        .unwrap();
    let post = OwnerPost {
        owners: Arc::new(Owners),
        directory: Arc::new(FixedHosts(vec![slot(
            "a",
            "http://127.0.0.1:9".into(),
            false,
        )])),
        me: "ctl".into(),
        api_key: "hx_k".into(),
        daemon_key: "hxd_d".into(),
    };
    start_control(s, Arc::new(sessions), post, Arc::new(policies)).await
}

/// The control role's broker serves the operator's routes behind the API
/// key; its metrics are registered once (a second broker on the same
/// registry is refused, typed).
#[tokio::test]
async fn the_control_roles_broker_serves_its_operator_behind_the_key() {
    let (db, dir, reg) = (
        hatchery_db::Db::sqlite_memory().unwrap(),
        tempfile::tempdir().unwrap(),
        prometheus::Registry::new(),
    );
    let a = args();
    let s = settings(&a, &db, dir.path(), &reg);
    let app = control(&s).await.unwrap();
    let get = |key: Option<&str>| {
        let mut r = axum::http::Request::builder().uri("/v1/sessions/ses_a/broker/calls");
        if let Some(k) = key {
            r = r.header("authorization", format!("Bearer {k}"));
        }
        r.body(Body::empty()).unwrap()
    };
    let resp = app.clone().oneshot(get(None)).await.unwrap();
    assert_eq!(resp.status(), 401);
    let resp = app.oneshot(get(Some("hx_k"))).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(reg
        .gather()
        .iter()
        .any(|m| m.get_name().starts_with("hatchery_broker")));
    let e = control(&s).await.err().unwrap();
    assert!(matches!(e, EmbedError::Metrics(_)), "{e}");
}

/// A host with `broker.control_url` runs no broker: no operator routes,
/// and its socket relays (the relay itself is tested in relay.rs).
#[tokio::test]
async fn a_relaying_host_serves_its_socket_and_no_broker() {
    let (db, dir, reg) = (
        hatchery_db::Db::sqlite_memory().unwrap(),
        tempfile::tempdir().unwrap(),
        prometheus::Registry::new(),
    );
    let a = BrokerArgs {
        control_url: Some("http://127.0.0.1:9/".into()),
        ..args()
    };
    let s = settings(&a, &db, dir.path(), &reg);
    let sessions = sessions(&db).await;
    let policies = hatchery_policy::DbPolicyStore::open(db.clone())
        .await
        .unwrap();
    let app = start_host(&s, sessions, Arc::new(policies)).await.unwrap();
    let req = axum::http::Request::builder()
        .uri("/v1/sessions/ses_a/broker/calls")
        .header("authorization", "Bearer hx_k")
        .body(Body::empty())
        .unwrap();
    assert_eq!(app.oneshot(req).await.unwrap().status(), 404);
    let sock = socket_path(dir.path());
    for _ in 0..100 {
        if sock.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(sock.exists());
    assert!(reg.gather().is_empty(), "no broker metrics");
}

/// A sessions service on `db`, its sandboxes and policies fakes.
async fn sessions(db: &hatchery_db::Db) -> Arc<Sessions> {
    let store = hatchery_sessions::store::DbSessionStore::open(db.clone(), "local")
        .await
        .unwrap();
    Sessions::new(
        Arc::new(store),
        Default::default(),
        Arc::new(hatchery_sessions::policy::BuiltinPolicies),
        Arc::new(hatchery_sessions::sandbox::fake::FakeSandboxes::new()),
        Arc::new(hatchery_sessions::scheduler::LocalScheduler::new(1)),
    )
}

/// A host's own broker: its operator routes and metrics; a bad anchor
/// hook is refused before anything is started or registered.
#[tokio::test]
async fn a_host_runs_its_own_broker() {
    let (db, dir, reg) = (
        hatchery_db::Db::sqlite_memory().unwrap(),
        tempfile::tempdir().unwrap(),
        prometheus::Registry::new(),
    );
    let policies = Arc::new(
        hatchery_policy::DbPolicyStore::open(db.clone())
            .await
            .unwrap(),
    );
    let bad = BrokerArgs {
        anchor_hook: Some(r#"["worm-put"]"#.into()),
        anchor_interval_s: 60,
        ..args()
    };
    let s = settings(&bad, &db, dir.path(), &reg);
    let e = start_host(&s, sessions(&db).await, policies.clone())
        .await
        .err()
        .unwrap();
    assert!(
        matches!(e, EmbedError::AnchorHook(AnchorHookError::Relative(_))),
        "{e}"
    );
    assert!(reg.gather().is_empty());
    // So is an object store whose credentials file cannot be read.
    let bad = BrokerArgs {
        anchor_s3_url: Some("http://127.0.0.1:9/anchors".into()),
        anchor_s3_credentials_file: Some(dir.path().join("missing")),
        anchor_interval_s: 60,
        ..args()
    };
    let s = settings(&bad, &db, dir.path(), &reg);
    let e = start_host(&s, sessions(&db).await, policies.clone())
        .await
        .err()
        .unwrap();
    assert!(
        matches!(
            e,
            EmbedError::AnchorStore(hatchery_audit::s3::S3Error::Credentials(_))
        ),
        "{e}"
    );
    assert!(reg.gather().is_empty());

    let a = args();
    let s = settings(&a, &db, dir.path(), &reg);
    let app = start_host(&s, sessions(&db).await, policies).await.unwrap();
    let req = axum::http::Request::builder()
        .uri("/v1/sessions/ses_a/broker/calls")
        .body(Body::empty())
        .unwrap();
    // On a host the API's own layers check the key; these are the routes.
    assert_eq!(app.oneshot(req).await.unwrap().status(), 200);
    assert!(reg
        .gather()
        .iter()
        .any(|m| m.get_name().starts_with("hatchery_broker")));
}
