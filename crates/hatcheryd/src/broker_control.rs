//! `--role control --broker-for-hosts`: the tool broker for every host's
//! sandboxes (docs/sessions.md, "The broker on many hosts"). It holds the git
//! credential, the forge token and the MCP servers; hosts started with
//! `--broker-control-url` relay their sandboxes' calls to it
//! (`broker_relay`). It reads sessions from the shared database, writes
//! their events through each session's owning host (`broker_remote`),
//! reaches sandboxes (work trees to push) through this daemon's own API,
//! which routes to their hosts, and keeps its call record in the shared
//! database.

use crate::broker_remote::RemoteSessionLog;
use crate::serve::DaemonError;
use hatchery_broker::{Broker, BrokerConfig};
use hatchery_config::DaemonArgs;
use hatchery_sessions::owner_post::OwnerPost;
use std::path::Path;
use std::sync::Arc;

/// What the control role's broker is built from.
pub struct ControlSide<'a> {
    pub data: &'a Path,
    pub db: &'a hatchery_db::Db,
    pub api_key: &'a str,
    pub daemon_key: &'a str,
    pub sessions: Arc<dyn hatchery_sessions::store::SessionStore>,
    pub post: OwnerPost,
    pub registry: &'a prometheus::Registry,
}

/// The broker's routes (hosts' relays, and the operator's), or None when
/// this control role runs no broker.
pub async fn start(
    args: &DaemonArgs,
    c: ControlSide<'_>,
) -> Result<Option<axum::Router>, DaemonError> {
    if !args.broker.for_hosts {
        return Ok(None);
    }
    let err = |e: String| DaemonError::Sessions(format!("broker: {e}"));
    let mut cfg = BrokerConfig::try_from(&args.broker).map_err(|e| err(e.to_string()))?;
    cfg.caps.max_open_approvals = args.sessions.max_open_approvals;
    // In the shared database (the control role always has one): a second
    // control process, or this one restarted, finds every call made.
    let store = crate::broker::open_store(c.db, c.data)
        .await
        .map_err(|e| err(e.to_string()))?;
    let policies = crate::state_db::open_policies(c.db, c.data).await?;
    // Sandboxes are reached through this daemon's API: it routes each
    // request to the sandbox's host.
    let client = crate::broker::own_api(args, c.api_key).map_err(|e| err(e.to_string()))?;
    let broker = Broker::new(
        store,
        Arc::new(RemoteSessionLog {
            store: c.sessions,
            post: c.post,
        }),
        hatchery_policy::cache::CompiledPolicies::new(policies),
        Arc::new(hatchery_broker::sandbox::ClientSandboxes(client.clone())),
        cfg,
    );
    broker
        .metrics()
        .register(c.registry)
        .map_err(|e| err(e.to_string()))?;
    let b = broker.clone();
    tokio::spawn(async move {
        // Resolving a call caught mid-effect reads its sandbox through
        // this daemon's API: once it answers.
        let _ = client
            .wait_healthy(std::time::Duration::from_secs(120))
            .await;
        b.spawn_upkeep();
    });
    let keys = hatchery_route::relay::HostKeys {
        api_key: c.api_key.into(),
        daemon_key: c.daemon_key.into(),
    };
    tracing::info!(
        "tool broker serving the hosts' relays at {}",
        hatchery_broker::relay::PREFIX
    );
    Ok(Some(hatchery_broker::relay::control_routes(broker, keys)))
}

/// On a host: the `broker` host service relays to the control role, or
/// None when this host runs its own broker.
pub fn host_relay(
    args: &DaemonArgs,
    data: &Path,
    api_key: &str,
    daemon_key: &str,
) -> Result<Option<()>, DaemonError> {
    let Some(url) = &args.broker.control_url else {
        return Ok(None);
    };
    // The URL's form, no credentials here and a guest port were checked
    // with the rest of the configuration (hatchery-config rules.rs).
    let relay = hatchery_route::relay::Relay {
        control: url.trim_end_matches('/').to_string(),
        api_key: api_key.to_string(),
        daemon_key: daemon_key.to_string(),
        me: args.host_id.clone(),
        answer_within: hatchery_broker::relay::ANSWER_WITHIN,
    };
    let path = crate::broker::socket_path(data);
    tracing::info!(socket = %path.display(), control = %url, "broker calls relayed to the control role");
    tokio::spawn(async move {
        let app = hatchery_broker::relay::router(relay);
        if let Err(e) = hatchery_broker::routes::serve_on_socket(app, path).await {
            tracing::error!(error = %e, "broker relay socket stopped");
        }
    });
    Ok(Some(()))
}
