//! The tool broker (crates/hatchery-broker): its store (the `broker_`
//! tables of the deployment's one database),
//! its Unix socket (DATA_DIR/broker.sock, mode 0600) registered as the
//! `broker` host service every sandbox reaches at 127.0.0.1:GUEST_PORT,
//! and its operator routes.

use hatchery_broker::{Broker, BrokerConfig};
use hatchery_config::DaemonArgs;
use std::path::Path;
use std::sync::Arc;

pub fn socket_path(data: &Path) -> std::path::PathBuf {
    data.join("broker.sock")
}

/// The host service, registered before sandboxes are re-adopted.
pub fn host_service(args: &DaemonArgs, data: &Path) -> Option<hatchery_core::HostService> {
    (args.broker.guest_port != 0).then(|| hatchery_core::HostService {
        name: "broker".into(),
        guest_port: args.broker.guest_port,
        addr: hatchery_core::HostAddr::Unix(socket_path(data)),
        identity: hatchery_core::Identity::HttpHeader,
    })
}

/// The broker's record of calls: its `broker_` tables in the deployment's
/// one database (with a shared `postgres://` one, a session that moves to
/// another host finds the calls it already made). A single-host data dir
/// of the previous release has them in DATA_DIR/broker.db: copied in once.
pub async fn open_store(
    db: &hatchery_db::Db,
    data: &Path,
) -> Result<hatchery_broker::store::BrokerStore, hatchery_broker::store::StoreError> {
    use hatchery_broker::store::{schema, BrokerStore, StoreError};
    let s = BrokerStore::open(db.clone()).await?;
    let imported = db
        .import_sqlite(data, &schema::IMPORT)
        .await
        .map_err(|source| StoreError::Db {
            what: "import DATA_DIR/broker.db",
            source,
        })?;
    tracing::info!(backend = s.backend(), ?imported, "broker store open");
    Ok(s)
}

/// This daemon's own API, which the broker reaches sandboxes through
/// (files and exec; on the control role it routes to their hosts).
pub fn own_api(
    args: &DaemonArgs,
    api_key: &str,
) -> Result<hatchery_client::Client, hatchery_client::ClientError> {
    let mut addr = args.listen;
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    hatchery_client::Client::with_config(
        &format!("http://{addr}"),
        api_key,
        hatchery_client::ClientConfig::default().call_timeout(std::time::Duration::from_secs(150)),
    )
}

pub async fn start(
    args: &DaemonArgs,
    data: &Path,
    db: &hatchery_db::Db,
    api_key: &str,
    sessions: Arc<hatchery_sessions::Sessions>,
    policies: Arc<dyn hatchery_policy::PolicyStore>,
    registry: &prometheus::Registry,
) -> Result<Arc<Broker>, crate::DaemonError> {
    let err = |e: String| crate::DaemonError::Sessions(format!("broker: {e}"));
    let mut cfg = BrokerConfig::try_from(&args.broker).map_err(|e| err(e.to_string()))?;
    // One cap on open approvals for the session, whoever opens them.
    cfg.caps.max_open_approvals = args.sessions.max_open_approvals;
    let store = open_store(db, data).await.map_err(|e| err(e.to_string()))?;
    let client = own_api(args, api_key).map_err(|e| err(e.to_string()))?;
    let broker = Broker::new(
        store,
        Arc::new(hatchery_broker::session_log::Local(sessions.clone())),
        hatchery_policy::cache::CompiledPolicies::new(policies),
        Arc::new(hatchery_broker::sandbox::ClientSandboxes(client.clone())),
        cfg,
    );
    broker
        .metrics()
        .register(registry)
        .map_err(|e| err(e.to_string()))?;
    sessions.set_broker_usage(broker.clone());
    if args.broker.guest_port != 0 {
        let (b, path) = (broker.clone(), socket_path(data));
        let api = client.clone();
        tokio::spawn(async move {
            // Calls need this daemon's own API (sandbox files and exec):
            // take them once it answers.
            let _ = api.wait_healthy(std::time::Duration::from_secs(120)).await;
            if let Err(e) = hatchery_broker::routes::serve_socket(b, path).await {
                tracing::error!(error = %e, "broker socket stopped");
            }
        });
    }
    if args.broker.anchor_interval_s > 0 {
        // The heads of the session event chains, anchored outside the
        // database (docs/policy.md, "Anchors"); only heads that moved. From
        // whichever store the sessions are in (SQLite or PostgreSQL): the
        // anchoring runs on a blocking thread, which may wait on the store.
        let heads_of = sessions.clone();
        let rt = tokio::runtime::Handle::current();
        let mut anchor = hatchery_audit::Anchor::new(data.join("session-anchors.jsonl"));
        if let Some(json) = &args.broker.anchor_hook {
            anchor.hook = Some(hatchery_broker::config::parse_anchor_hook(json).map_err(err)?);
        }
        std::mem::drop(hatchery_audit::anchor::spawn_periodic(
            anchor,
            std::time::Duration::from_secs(args.broker.anchor_interval_s),
            move || {
                rt.block_on(heads_of.chain_heads())
                    .map_err(|e| hatchery_audit::AuditError::Heads(e.to_string()))
            },
        ));
    }
    // Calls left mid-effect, now and whenever another broker process on
    // the shared record stops renewing its heartbeat.
    broker.spawn_upkeep();
    Ok(broker)
}
