//! Starting the broker inside the daemon, in each of its three shapes
//! (docs/sessions.md, "The broker on many hosts"):
//!
//! - [`start_host`]: on a host that runs its own broker, next to the
//!   sessions service ([`Local`] log), its guest routes on a Unix socket
//!   (DATA_DIR/broker.sock, mode 0600) the `broker` host service reaches,
//!   and the session chains' heads anchored; or, with
//!   `broker.control_url`, that socket relaying every call to the control
//!   role (the host then runs no broker);
//! - [`start_control`]: on the control role for every host's sandboxes:
//!   sessions read from the shared store, events posted to their owners
//!   ([`RemoteSessionLog`]), served under the hosts' relay prefix.
//!
//! The daemon fills [`Settings`] from its configuration; this module
//! trusts them (they were checked with the rest of the configuration) and
//! knows neither the daemon's config nor its core.

use crate::config::{AnchorHookError, BrokerArgs, ConfigError};
use crate::session_log::remote::RemoteSessionLog;
use crate::session_log::{Local, SessionLog};
use crate::store::{schema, BrokerStore, StoreError};
use crate::{Broker, BrokerConfig};
use hatchery_client::{Client, ClientConfig, ClientError};
use hatchery_route::relay::{HostKeys, Relay};
use hatchery_sessions::owner_post::OwnerPost;
use hatchery_sessions::store::SessionStore;
use hatchery_sessions::Sessions;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// How long the broker waits for this daemon's own API before it takes
/// calls (or resolves calls caught mid-effect) through it.
const OWN_API_WITHIN: Duration = Duration::from_secs(120);
/// A call through the own API may push a work tree.
const OWN_API_CALL_TIMEOUT: Duration = Duration::from_secs(150);

/// What the broker is started with, from the daemon's configuration.
pub struct Settings<'a> {
    /// The `broker.*` options.
    pub broker: &'a BrokerArgs,
    /// `sessions.max_open_approvals`: one cap on open approvals for a
    /// session, whoever opens them.
    pub max_open_approvals: u64,
    /// This daemon's API address (`server.listen`).
    pub listen: SocketAddr,
    pub api_key: &'a str,
    /// The daemons' own key (`x-hatchery-daemon-key`): hosts' relays send
    /// it, the control role's broker wants it.
    pub daemon_key: &'a str,
    /// This daemon's host id (`role.host_id`).
    pub host_id: &'a str,
    pub data: &'a Path,
    /// The deployment's one database.
    pub db: &'a hatchery_db::Db,
    pub registry: &'a prometheus::Registry,
}

#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    #[error("broker: {0}")]
    Config(#[from] ConfigError),
    #[error("broker: {0}")]
    AnchorHook(#[from] AnchorHookError),
    #[error("broker: the object-store anchor settings")]
    AnchorS3(#[from] crate::config::AnchorS3Error),
    #[error("broker: the anchors' object store")]
    AnchorStore(#[source] hatchery_audit::s3::S3Error),
    #[error("broker: {0}")]
    Store(#[from] StoreError),
    #[error("broker: this daemon's own API: {0}")]
    OwnApi(#[from] ClientError),
    #[error("broker: metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

/// The socket the `broker` host service points at.
pub fn socket_path(data: &Path) -> PathBuf {
    data.join("broker.sock")
}

/// The broker's record of calls: its `broker_` tables in the deployment's
/// one database (with a shared `postgres://` one, a session that moves to
/// another host finds the calls it already made). A single-host data dir
/// of the previous release has them in DATA_DIR/broker.db: copied in once.
async fn open_store(db: &hatchery_db::Db, data: &Path) -> Result<BrokerStore, StoreError> {
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

/// Where this daemon's own API answers: its listen address, the loopback
/// one when it listens on all.
fn own_api_url(mut listen: SocketAddr) -> String {
    if listen.ip().is_unspecified() {
        listen.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    format!("http://{listen}")
}

/// This daemon's own API, which the broker reaches sandboxes through
/// (files and exec; on the control role it routes to their hosts).
fn own_api(listen: SocketAddr, api_key: &str) -> Result<Client, ClientError> {
    Client::with_config(
        &own_api_url(listen),
        api_key,
        ClientConfig::default().call_timeout(OWN_API_CALL_TIMEOUT),
    )
}

fn config(s: &Settings<'_>) -> Result<BrokerConfig, ConfigError> {
    let mut cfg = BrokerConfig::try_from(s.broker)?;
    cfg.caps.max_open_approvals = s.max_open_approvals;
    cfg.scratch = crate::git::scratch_root(s.data).map_err(ConfigError::Scratch)?;
    Ok(cfg)
}

/// The broker on `log`, its metrics registered; and the own API client it
/// reaches sandboxes through.
async fn build(
    s: &Settings<'_>,
    log: Arc<dyn SessionLog>,
    policies: Arc<dyn hatchery_policy::PolicyStore>,
) -> Result<(Arc<Broker>, Client), EmbedError> {
    let cfg = config(s)?;
    let store = open_store(s.db, s.data).await?;
    let client = own_api(s.listen, s.api_key)?;
    let broker = Broker::new(
        store,
        log,
        hatchery_policy::cache::CompiledPolicies::new(policies),
        Arc::new(crate::sandbox::ClientSandboxes(client.clone())),
        cfg,
    );
    broker.metrics().register(s.registry)?;
    Ok((broker, client))
}

/// On a host: the broker's operator routes, or none when the host relays
/// its sandboxes' calls to the control role's broker.
pub async fn start_host(
    s: &Settings<'_>,
    sessions: Arc<Sessions>,
    policies: Arc<dyn hatchery_policy::PolicyStore>,
) -> Result<axum::Router, EmbedError> {
    // The chains this host writes are anchored whether its broker is its
    // own or the control role's (whose events this host commits).
    spawn_anchoring(s, sessions.clone())?;
    if let Some(url) = &s.broker.control_url {
        spawn_host_relay(s, url);
        return Ok(axum::Router::new());
    }
    let b = start_own(s, sessions, policies).await?;
    Ok(crate::routes::operator_router(b))
}

/// The heads of the session event chains this host owns, anchored outside
/// the database every `--audit-anchor-interval` (docs/policy.md,
/// "Anchors"): appended to `--audit-anchor-file` (DATA_DIR's
/// session-anchors.jsonl unless given; put it on other storage), handed
/// to the hook, and put to the object store as a new object. Only heads
/// that moved since each sink stored them. From whichever store the
/// sessions are in (SQLite or PostgreSQL): the anchoring runs on a
/// blocking thread, which may wait on the store.
fn spawn_anchoring(s: &Settings<'_>, sessions: Arc<Sessions>) -> Result<(), EmbedError> {
    // Checked before anything starts.
    let hook = match &s.broker.anchor_hook {
        Some(json) => Some(crate::config::parse_anchor_hook(json)?),
        None => None,
    };
    let s3 = match crate::config::anchor_s3(s.broker)? {
        Some(c) => {
            let mut store =
                hatchery_audit::s3::S3Store::new(c.location, &c.region, c.credentials_file)
                    .map_err(EmbedError::AnchorStore)?;
            if let Some(ca) = c.ca_file {
                store = store.with_ca_file(ca);
            }
            store.check_credentials().map_err(EmbedError::AnchorStore)?;
            store.check_trust().map_err(EmbedError::AnchorStore)?;
            Some(store)
        }
        None => None,
    };
    if s.broker.anchor_interval_s == 0 {
        return Ok(());
    }
    let rt = tokio::runtime::Handle::current();
    let file = s
        .broker
        .anchor_file
        .clone()
        .unwrap_or_else(|| s.data.join("session-anchors.jsonl"));
    let mut anchor = hatchery_audit::Anchor::new(file);
    if let Some(argv) = hook {
        anchor = anchor.with_hook(argv);
    }
    if let Some(store) = s3 {
        tracing::info!(bucket = %store.location.bucket, prefix = %store.location.anchors_prefix(),
            "audit anchors also go to the object store");
        anchor = anchor.with(hatchery_audit::sink::S3Sink::new(
            Arc::new(store),
            rt.clone(),
        ));
    }
    anchor.metrics.register(s.registry)?;
    std::mem::drop(hatchery_audit::anchor::spawn_periodic(
        anchor,
        Duration::from_secs(s.broker.anchor_interval_s),
        move || {
            rt.block_on(sessions.chain_heads())
                .map_err(|e| hatchery_audit::AuditError::Heads(e.to_string()))
        },
    ));
    Ok(())
}

/// The broker of a host that runs its own: its socket served (when the
/// guest port is on) and calls left mid-effect taken up.
async fn start_own(
    s: &Settings<'_>,
    sessions: Arc<Sessions>,
    policies: Arc<dyn hatchery_policy::PolicyStore>,
) -> Result<Arc<Broker>, EmbedError> {
    let (broker, client) = build(s, Arc::new(Local(sessions.clone())), policies).await?;
    sessions.set_broker_usage(broker.clone());
    if s.broker.guest_port != 0 {
        let (b, path) = (broker.clone(), socket_path(s.data));
        tokio::spawn(async move {
            // Calls need this daemon's own API (sandbox files and exec):
            // take them once it answers.
            let _ = client.wait_healthy(OWN_API_WITHIN).await;
            if let Err(e) = crate::routes::serve_socket(b, path).await {
                tracing::error!(error = %e, "broker socket stopped");
            }
        });
    }
    // Calls left mid-effect, now and whenever another broker process on
    // the shared record stops renewing its heartbeat.
    broker.spawn_upkeep();
    Ok(broker)
}

/// The control role's broker for every host's sandboxes
/// (`broker.for_hosts`): its call record in the shared database (a second
/// control process, or this one restarted, finds every call made),
/// sandboxes reached through this daemon's API (which routes to their
/// hosts). Its routes: the hosts' relays and the operator's.
pub async fn start_control(
    s: &Settings<'_>,
    sessions: Arc<dyn SessionStore>,
    post: OwnerPost,
    policies: Arc<dyn hatchery_policy::PolicyStore>,
) -> Result<axum::Router, EmbedError> {
    let log = Arc::new(RemoteSessionLog::new(sessions, post));
    let (broker, client) = build(s, log, policies).await?;
    let b = broker.clone();
    tokio::spawn(async move {
        // Resolving a call caught mid-effect reads its sandbox through
        // this daemon's API: once it answers.
        let _ = client.wait_healthy(OWN_API_WITHIN).await;
        b.spawn_upkeep();
    });
    tracing::info!(
        "tool broker serving the hosts' relays at {}",
        crate::relay::PREFIX
    );
    Ok(crate::relay::control_routes(broker, keys(s)))
}

fn keys(s: &Settings<'_>) -> HostKeys {
    HostKeys {
        api_key: s.api_key.into(),
        daemon_key: s.daemon_key.into(),
    }
}

/// The `broker` host service relays every call to the control role at
/// `control_url`. The URL's form, no credentials here and a guest port
/// were checked with the rest of the configuration.
fn spawn_host_relay(s: &Settings<'_>, control_url: &str) {
    let relay = Relay {
        control: control_url.trim_end_matches('/').to_string(),
        api_key: s.api_key.to_string(),
        daemon_key: s.daemon_key.to_string(),
        me: s.host_id.to_string(),
        answer_within: crate::relay::ANSWER_WITHIN,
    };
    let path = socket_path(s.data);
    tracing::info!(socket = %path.display(), control = %control_url, "broker calls relayed to the control role");
    tokio::spawn(async move {
        let app = crate::relay::router(relay);
        if let Err(e) = crate::routes::serve_on_socket(app, path).await {
            tracing::error!(error = %e, "broker relay socket stopped");
        }
    });
}

#[cfg(test)]
#[path = "embed_tests.rs"]
mod tests;
