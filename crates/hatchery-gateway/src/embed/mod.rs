//! The gateway inside another process (the Hatchery daemon; docs/gateway.md,
//! "In the daemon"), started from a small typed [`Settings`] its caller
//! fills from its own configuration. Three ways to run:
//!
//! - [`serve_sandboxes`]: a host (or `all`) with an upstream of its own.
//!   The model routes are served on a Unix socket in the data dir (0700,
//!   so only the daemon's own user can connect), which the daemon
//!   registers as the host service every sandbox reaches at
//!   `127.0.0.1:guest_port`; the daemon's relay sets `X-Hatchery-Sandbox`,
//!   so the gateway trusts that header and the sandbox holds no key.
//! - [`relay_sandboxes`]: a host whose sandboxes' calls go to the control
//!   role's gateway (`--gateway-control-url`): it holds no upstream key;
//!   its socket relays each call ([`crate::relay`]) and it only writes the
//!   sandbox bindings, in the shared database the control role reads.
//! - [`serve_hosts`]: the control role's gateway, for hosts' relays only,
//!   charging the shared budgets.
//!
//! Where the events go is the caller's ([`crate::events::GatewayEvents`]):
//! this crate knows nothing of sessions.

mod link;

pub use link::{GatewayLink, TenantScope};

use crate::budget::{BudgetError, BudgetStore, KeyStore};
use crate::events::GatewayEvents;
use crate::policy::CallPolicy;
use crate::upstream::{Upstream, UpstreamError};
use crate::usage::Flavor;
use crate::Gateway;
use hatchery_route::relay::{HostKeys, Relay};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// What an embedded gateway is configured with (the daemon's
/// `--gateway-*` options).
#[derive(Debug, Clone)]
pub struct Settings {
    pub openai_upstream: Option<String>,
    pub anthropic_upstream: Option<String>,
    /// Extra CA for `https://` upstreams.
    pub upstream_ca_file: Option<PathBuf>,
    /// The upstream's key (one line); none: calls go without one.
    pub upstream_key_file: Option<PathBuf>,
    /// The price table (JSON, [`crate::pricing::Prices`]); required with
    /// an upstream.
    pub prices: Option<PathBuf>,
    /// Where sandboxes reach the gateway on their loopback.
    pub guest_port: u16,
    pub max_output_tokens: u64,
    pub reservation_ttl: Duration,
    pub upstream_timeout: Duration,
}

impl Settings {
    pub fn has_upstream(&self) -> bool {
        self.openai_upstream.is_some() || self.anthropic_upstream.is_some()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    #[error("--gateway-prices is required with a gateway upstream")]
    NoPrices,
    #[error("{}: {source}", path.display())]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("price table {}: {source}", path.display())]
    Prices {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("gateway upstream: {0}")]
    Upstream(#[from] UpstreamError),
    #[error("gateway store: {0}")]
    Store(#[from] BudgetError),
    #[error("gateway socket {}: {source}", path.display())]
    Listen {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--gateway-control-url: needs a shared postgres:// --db (the control role reads the bindings there)")]
    RelayNeedsSharedDb,
}

/// Who this host is to the control role: its relay signs each call with
/// these.
pub struct HostIdentity<'a> {
    pub api_key: &'a str,
    /// The deployment's daemon key: proves that a call comes from a host,
    /// not from a client holding the API key.
    pub daemon_key: &'a str,
    pub host_id: &'a str,
}

/// A host with an upstream: the store (see [`open_budgets`]), janitor,
/// events to `events()` and the socket listener; `None` without an
/// upstream (then `events` is not called).
pub async fn serve_sandboxes(
    s: &Settings,
    db: &hatchery_db::Db,
    data: &Path,
    registry: &prometheus::Registry,
    events: impl FnOnce() -> Arc<dyn GatewayEvents>,
    policy: Option<Arc<dyn CallPolicy>>,
) -> Result<Option<GatewayLink>, EmbedError> {
    if !s.has_upstream() {
        return Ok(None);
    }
    let (store, keys) = open_budgets(db, data).await?;
    let events = events();
    let g = build(
        s,
        store.clone(),
        keys.clone(),
        events.clone(),
        registry,
        policy,
    )?;
    crate::spawn_janitor(store.clone(), events.clone());
    let socket = serve_socket(data, model_routes(g))?;
    tracing::info!(socket = %socket.display(), guest_port = s.guest_port, "model gateway serving sandboxes");
    Ok(Some(GatewayLink {
        store,
        keys,
        guest_port: s.guest_port,
        socket,
        settle_within: settle_within(s.reservation_ttl),
        events: Some(events),
    }))
}

/// How long a session's end waits for its calls in flight: the answer
/// deadline (by which every call is settled or charged whole) and a
/// little more for the settle's own write.
fn settle_within(reservation_ttl: std::time::Duration) -> std::time::Duration {
    crate::settle::answer_deadline(reservation_ttl) + std::time::Duration::from_secs(2)
}

/// A host relaying its sandboxes' calls to the control role at `control`:
/// only the binding store (where the control role's gateway reads it) and
/// the relay on the socket.
pub async fn relay_sandboxes(
    s: &Settings,
    db: &hatchery_db::Db,
    data: &Path,
    control: &str,
    me: HostIdentity<'_>,
) -> Result<GatewayLink, EmbedError> {
    // The URL's form, and that this host has no upstream of its own, were
    // checked with the rest of the daemon's configuration.
    if db.dialect() != hatchery_db::Dialect::Postgres {
        return Err(EmbedError::RelayNeedsSharedDb);
    }
    let (store, keys) = open_budgets(db, data).await?;
    let relay = Relay {
        control: control.trim_end_matches('/').to_string(),
        api_key: me.api_key.to_string(),
        daemon_key: me.daemon_key.to_string(),
        me: me.host_id.to_string(),
        answer_within: s.upstream_timeout + crate::relay::CONTROL_MARGIN,
    };
    let socket = serve_socket(data, crate::relay::router(relay))?;
    tracing::info!(socket = %socket.display(), control, "model calls relayed to the control role's gateway");
    Ok(GatewayLink {
        store,
        keys,
        guest_port: s.guest_port,
        socket,
        // The control role's gateway settles these calls in the shared
        // tables this host reads; its TTL is the deployment's setting.
        settle_within: settle_within(s.reservation_ttl),
        events: None,
    })
}

/// The control role's gateway, if an upstream is configured: the model
/// routes under [`crate::relay::PREFIX`], for hosts' relays only (`keys`
/// and a sandbox id are required), budgets in the shared database, events
/// to what `events` makes of the budget store (a settle that cannot travel
/// with its event is made there).
pub async fn serve_hosts(
    s: &Settings,
    db: &hatchery_db::Db,
    data: &Path,
    registry: &prometheus::Registry,
    keys_wanted: HostKeys,
    events: impl FnOnce(Arc<dyn BudgetStore>) -> Arc<dyn GatewayEvents>,
    policy: Option<Arc<dyn CallPolicy>>,
) -> Result<Option<axum::Router>, EmbedError> {
    if !s.has_upstream() {
        return Ok(None);
    }
    let (store, keys) = open_budgets(db, data).await?;
    let events = events(store.clone());
    let g = build(s, store.clone(), keys, events.clone(), registry, policy)?;
    crate::spawn_janitor(store, events);
    tracing::info!("model gateway serving the hosts' relays at /v1/model-gateway");
    Ok(Some(crate::relay::control_routes(
        model_routes(g),
        keys_wanted,
    )))
}

fn read(p: &Path) -> Result<Vec<u8>, EmbedError> {
    std::fs::read(p).map_err(|source| EmbedError::File {
        path: p.to_path_buf(),
        source,
    })
}

/// The budget and key store: the `gateway_` tables of the deployment's one
/// database (with a shared `postgres://` one, a session's spend follows it
/// when it moves to another host: a fresh per-host budget would let it
/// spend its limit again on each). A single-host data dir of the previous
/// release has them in DATA_DIR/gateway.db: copied in once.
async fn open_budgets(
    db: &hatchery_db::Db,
    data: &Path,
) -> Result<(Arc<dyn BudgetStore>, Arc<dyn KeyStore>), EmbedError> {
    use crate::store::{schema, GatewayStore};
    let s = Arc::new(GatewayStore::open(db.clone()).await?);
    let imported = db
        .import_sqlite(data, &schema::IMPORT)
        .await
        .map_err(|source| BudgetError::Db {
            what: "import DATA_DIR/gateway.db",
            source,
        })?;
    tracing::info!(db = %db.describe(), ?imported, "gateway store open");
    Ok((s.clone(), s))
}

/// The gateway itself, from its settings: prices, upstreams and their key,
/// metrics in `registry`, events to `events`.
fn build(
    s: &Settings,
    store: Arc<dyn BudgetStore>,
    keys: Arc<dyn KeyStore>,
    events: Arc<dyn GatewayEvents>,
    registry: &prometheus::Registry,
    policy: Option<Arc<dyn CallPolicy>>,
) -> Result<Arc<Gateway>, EmbedError> {
    let prices_path = s.prices.as_ref().ok_or(EmbedError::NoPrices)?;
    let prices =
        serde_json::from_slice(&read(prices_path)?).map_err(|source| EmbedError::Prices {
            path: prices_path.clone(),
            source,
        })?;
    let key = match &s.upstream_key_file {
        Some(p) => String::from_utf8_lossy(&read(p)?).trim().to_string(),
        None => String::new(),
    };
    let up = |flavor, url: &Option<String>| {
        url.as_deref()
            .map(|u| {
                Upstream::with_ca(
                    flavor,
                    u,
                    &key,
                    s.upstream_timeout,
                    s.upstream_ca_file.as_deref(),
                )
            })
            .transpose()
    };
    let metrics = crate::metrics::Metrics::default();
    for c in [
        Box::new(metrics.calls.clone()) as Box<dyn prometheus::core::Collector>,
        Box::new(metrics.reserve_seconds.clone()),
    ] {
        if let Err(e) = registry.register(c) {
            tracing::warn!(error = %e, "gateway metrics not registered");
        }
    }
    Ok(Arc::new(Gateway {
        store,
        keys,
        prices,
        openai: up(Flavor::OpenAi, &s.openai_upstream)?,
        anthropic: up(Flavor::Anthropic, &s.anthropic_upstream)?,
        max_output_tokens: s.max_output_tokens,
        max_body: 1 << 20,
        reservation_ttl_ms: s.reservation_ttl.as_millis() as u64,
        trust_sandbox_header: true,
        // The admin routes are not served: the daemon binds in-process.
        admin_key: String::new(),
        metrics,
        events,
        policy,
    }))
}

/// Serves `app` on the gateway's Unix socket in the data dir.
fn serve_socket(data: &Path, app: axum::Router) -> Result<PathBuf, EmbedError> {
    let socket = data.join("gateway.sock");
    let _ = std::fs::remove_file(&socket);
    let listener =
        tokio::net::UnixListener::bind(&socket).map_err(|source| EmbedError::Listen {
            path: socket.clone(),
            source,
        })?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "gateway listener failed");
        }
    });
    Ok(socket)
}

/// Only the model routes: guest code reaches this listener, so the admin
/// routes (budgets, bindings, keys) are not on it at all.
pub fn model_routes(g: Arc<Gateway>) -> axum::Router {
    use axum::extract::State;
    use axum::routing::post;
    axum::Router::new()
        .route(
            "/v1/chat/completions",
            post(|State(g): State<Arc<Gateway>>, h, b| {
                crate::calls::call(g, Flavor::OpenAi, "/v1/chat/completions", h, b)
            }),
        )
        .route(
            "/v1/messages",
            post(|State(g): State<Arc<Gateway>>, h, b| {
                crate::calls::call(g, Flavor::Anthropic, "/v1/messages", h, b)
            }),
        )
        .with_state(g)
}

#[cfg(test)]
mod tests;
