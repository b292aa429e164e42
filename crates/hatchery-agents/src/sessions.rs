//! Agent sessions (`/v1/sessions`): their tables in the deployment's one
//! database (DATA_DIR/hatchery.db, or the PostgreSQL of a `postgres://`
//! --db), and sandboxes through the daemon's own public API
//! (hatchery-client).

use hatchery_config::DaemonArgs;
use hatchery_sessions::client_sandboxes::ClientSandboxes;
use hatchery_sessions::policy::PolicyCatalog;
use hatchery_sessions::scheduler::LocalScheduler;
use hatchery_sessions::{Sessions, SessionsConfig};
use std::sync::Arc;

pub(crate) fn build(
    args: &DaemonArgs,
    store: Arc<dyn hatchery_sessions::store::SessionStore>,
    (api_key, daemon_key): (&str, &str),
    registry: &prometheus::Registry,
    policies: Arc<dyn PolicyCatalog>,
    environments: hatchery_sessions::environments::store::EnvStore,
    tenants: Arc<hatchery_tenants::Tenants>,
) -> Result<(axum::Router, Arc<Sessions>), crate::AgentsError> {
    let mut addr = args.listen;
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let client = hatchery_client::Client::with_config(
        &format!("http://{addr}"),
        api_key,
        // Snapshots get runsc's 60 s checkpoint limit plus margin.
        hatchery_client::ClientConfig::default().call_timeout(std::time::Duration::from_secs(150)),
    )?;
    let mut cfg = SessionsConfig::from(&args.sessions);
    // Repository fetches work under the data dir (0700, the daemon's own
    // disk), never the host's shared /tmp; what a killed daemon left
    // there is removed before any runner starts.
    cfg.fetch_root = args.data_dir.join("repo-fetch");
    hatchery_sessions::repo::clean_work_root(&cfg.fetch_root);
    let sandboxes = Arc::new(ClientSandboxes::new(client));
    let svc = Sessions::new(
        store,
        cfg.clone(),
        policies,
        sandboxes.clone(),
        Arc::new(LocalScheduler::new(cfg.max_running)),
    );
    // Environments (`/v1/environments`, sessions' `environment_id`): the
    // same sandboxes, fetch caps and credential as the sessions.
    let envs =
        hatchery_sessions::environments::Environments::new(environments, sandboxes, cfg.clone());
    // Environments whose template was rebuilt are rebuilt too: swept at
    // start and every minute (and checked when a session asks for one).
    envs.spawn_sweeps(hatchery_sessions::environments::service::SWEEP_EVERY);
    svc.set_environments(envs);
    // A control role's broker posts its call rows with its events, and its
    // gateway a call's settle; this host commits them together (issue 32).
    use hatchery_sessions::broker_hooks::JoinedFrom;
    svc.set_remote_joined(
        JoinedFrom::Broker,
        Arc::new(hatchery_broker::store::Decoder),
    );
    svc.set_remote_joined(
        JoinedFrom::Gateway,
        Arc::new(hatchery_model_events::SettleDecoder),
    );
    svc.metrics().register(registry)?;
    let routes = hatchery_sessions::router(
        svc.clone(),
        api_key.into(),
        daemon_key.into(),
        Some(tenants),
    );
    Ok((routes, svc))
}

/// The environments' tables on the deployment's database, migrated.
pub async fn open_environments(
    db: &hatchery_db::Db,
) -> Result<hatchery_sessions::environments::store::EnvStore, crate::AgentsError> {
    use hatchery_sessions::environments::{store::EnvStore, EnvError};
    Ok(hatchery_db::retry_while_unreachable(
        "environments",
        || EnvStore::open(db.clone()),
        |e| matches!(e, EnvError::Unavailable(_)),
    )
    .await?)
}

/// The sessions store on the deployment's database, migrated: on a
/// `postgres://` --db written as `--host-id` (fenced to this host's
/// sessions), retried with backoff while the database is not up yet;
/// otherwise as the single-host default, after copying a data dir's old
/// `sessions.db` in (once).
pub async fn open_store(
    args: &DaemonArgs,
    db: &hatchery_db::Db,
    data: &std::path::Path,
) -> Result<Arc<dyn hatchery_sessions::store::SessionStore>, crate::AgentsError> {
    use hatchery_sessions::store::{DbSessionStore, StoreError, LOCAL_HOST};
    let host = match args.shared_db() {
        Some(_) => args.host_id.as_str(),
        None => LOCAL_HOST,
    };
    let s = hatchery_db::retry_while_unreachable(
        "sessions",
        || DbSessionStore::open(db.clone(), host),
        |e| matches!(e, StoreError::Unavailable(_)),
    )
    .await?;
    let imported = s.import_sqlite(data).await?;
    if imported == hatchery_db::Imported::Now {
        tracing::info!("sessions: the data dir's sessions.db was copied into the database");
    }
    Ok(Arc::new(s))
}
