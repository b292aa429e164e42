//! The model gateway inside the daemon (docs/gateway.md, "In the daemon").
//! It runs in-process: its router is served on a Unix socket in the data
//! dir (0700, so only the daemon's own user can connect), registered as the
//! host service every sandbox reaches at `127.0.0.1:GUEST_PORT`; the relay
//! sets `X-Hatchery-Sandbox`, so the gateway trusts that header and the
//! sandbox holds no key. In-process because the sessions runner binds each
//! session's sandbox and budget directly, and the gateway's settlements and
//! refusals land in the session's event log without another hop.
//!
//! On many hosts the gateway can run on the control role instead
//! (`--gateway-control-url` on the hosts): a host then holds no upstream
//! key; its socket relays each call to the control plane
//! (`gateway_relay.rs`), which charges the shared budgets and posts the
//! events to the session's owner (`gateway_events.rs`).

use hatchery_config::GatewayArgs;
use hatchery_gateway::budget::{BudgetStore, Caller, KeyStore};
use hatchery_gateway::upstream::Upstream;
use hatchery_gateway::usage::Flavor;
use hatchery_gateway::Gateway;
use hatchery_sessions::Sessions;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum GatewayStartError {
    #[error("--gateway-prices is required with a gateway upstream")]
    NoPrices,
    #[error("{0}: {1}")]
    File(PathBuf, std::io::Error),
    #[error("price table {0}: {1}")]
    Prices(PathBuf, serde_json::Error),
    #[error("gateway upstream: {0}")]
    Upstream(#[from] hatchery_gateway::upstream::UpstreamError),
    #[error("gateway store: {0}")]
    Store(#[from] hatchery_gateway::budget::BudgetError),
    #[error("gateway socket {0}: {1}")]
    Listen(PathBuf, std::io::Error),
    #[error("--gateway-control-url: {0}")]
    ControlUrl(String),
}

/// The running gateway, as the session hooks use it.
pub struct GatewayLink {
    pub store: Arc<dyn BudgetStore>,
    pub keys: Arc<dyn KeyStore>,
    pub guest_port: u16,
    pub socket: PathBuf,
}

impl GatewayLink {
    /// Charges `sandbox`'s calls to `session`, within its budget
    /// (`usd_cents` 0: no limit in cents).
    pub async fn bind(
        &self,
        session: &str,
        sandbox: &str,
        tokens: u64,
        usd_cents: u64,
    ) -> Result<(), String> {
        let scope = format!("session:{session}");
        self.store
            .set_limits(&scope, Some(tokens), (usd_cents > 0).then_some(usd_cents))
            .await
            .map_err(|e| e.to_string())?;
        self.keys
            .bind_sandbox(
                sandbox,
                &Caller {
                    session: session.to_string(),
                    tenant: None,
                },
            )
            .await
            .map_err(|e| e.to_string())
    }

    pub async fn unbind(&self, sandbox: &str) {
        if let Err(e) = self.keys.unbind_sandbox(sandbox).await {
            tracing::warn!(sandbox, error = %e, "gateway unbind failed");
        }
    }
}

fn read(p: &Path) -> Result<Vec<u8>, GatewayStartError> {
    std::fs::read(p).map_err(|e| GatewayStartError::File(p.to_path_buf(), e))
}

/// The budget and key store: the `gateway_` tables of the deployment's one
/// database (with a shared `postgres://` one, a session's spend follows it
/// when it moves to another host: a fresh per-host budget would let it
/// spend its limit again on each). A single-host data dir of the previous
/// release has them in DATA_DIR/gateway.db: copied in once.
async fn open_budgets(
    db: &hatchery_db::Db,
    data: &Path,
) -> Result<(Arc<dyn BudgetStore>, Arc<dyn KeyStore>), GatewayStartError> {
    use hatchery_gateway::budget::BudgetError;
    use hatchery_gateway::store::{schema, GatewayStore};
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

/// The gateway itself, from its options: prices, upstreams and their key,
/// metrics in `registry`, events to `events`.
fn build(
    a: &GatewayArgs,
    store: Arc<dyn BudgetStore>,
    keys: Arc<dyn KeyStore>,
    events: Arc<dyn hatchery_gateway::events::GatewayEvents>,
    registry: &prometheus::Registry,
) -> Result<Arc<Gateway>, GatewayStartError> {
    let prices_path = a.prices.as_ref().ok_or(GatewayStartError::NoPrices)?;
    let prices = serde_json::from_slice(&read(prices_path)?)
        .map_err(|e| GatewayStartError::Prices(prices_path.clone(), e))?;
    let key = match &a.upstream_key_file {
        Some(p) => String::from_utf8_lossy(&read(p)?).trim().to_string(),
        None => String::new(),
    };
    let timeout = Duration::from_secs(a.upstream_timeout_s);
    let up = |flavor, url: &Option<String>| {
        url.as_deref()
            .map(|u| Upstream::with_ca(flavor, u, &key, timeout, a.upstream_ca_file.as_deref()))
            .transpose()
    };
    let metrics = hatchery_gateway::metrics::Metrics::default();
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
        openai: up(Flavor::OpenAi, &a.openai_upstream)?,
        anthropic: up(Flavor::Anthropic, &a.anthropic_upstream)?,
        max_output_tokens: a.max_output_tokens,
        max_body: 1 << 20,
        reservation_ttl_ms: a.reservation_ttl_s * 1000,
        trust_sandbox_header: true,
        // The admin routes are not served: the daemon binds in-process.
        admin_key: String::new(),
        metrics,
        events,
    }))
}

/// Serves `app` on the gateway's Unix socket in the data dir.
fn serve_socket(data: &Path, app: axum::Router) -> Result<PathBuf, GatewayStartError> {
    let socket = data.join("gateway.sock");
    let _ = std::fs::remove_file(&socket);
    let listener = tokio::net::UnixListener::bind(&socket)
        .map_err(|e| GatewayStartError::Listen(socket.clone(), e))?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "gateway listener failed");
        }
    });
    Ok(socket)
}

/// What a host (or `all`) daemon needs to start its side of the gateway.
pub struct HostSide<'a> {
    pub data: &'a Path,
    pub db: &'a hatchery_db::Db,
    pub sessions: Arc<Sessions>,
    pub registry: &'a prometheus::Registry,
    pub api_key: &'a str,
    /// The deployment's daemon key: the relay proves with it that a call
    /// comes from a host, not from a client holding the API key.
    pub daemon_key: &'a str,
    pub host_id: &'a str,
}

/// Starts the gateway if an upstream is configured: its store (see
/// `open_budgets`), janitor, event writer and socket listener. With
/// `--gateway-control-url` instead, only the binding store and the relay
/// to the control role's gateway.
pub async fn start(
    a: &GatewayArgs,
    h: HostSide<'_>,
) -> Result<Option<Arc<GatewayLink>>, GatewayStartError> {
    if let Some(url) = &a.control_url {
        // Its form, and that this host has no upstream of its own, were
        // checked with the rest of the configuration (hatchery-config
        // rules.rs). Bindings go where the control role's gateway reads them.
        if h.db.dialect() != hatchery_db::Dialect::Postgres {
            return Err(GatewayStartError::ControlUrl(
                "needs a shared postgres:// --db (the control role reads the bindings there)"
                    .into(),
            ));
        }
        let (store, keys) = open_budgets(h.db, h.data).await?;
        let relay = hatchery_route::relay::Relay {
            control: url.trim_end_matches('/').to_string(),
            api_key: h.api_key.to_string(),
            daemon_key: h.daemon_key.to_string(),
            me: h.host_id.to_string(),
            answer_within: Duration::from_secs(a.upstream_timeout_s)
                + hatchery_gateway::relay::CONTROL_MARGIN,
        };
        let socket = serve_socket(h.data, hatchery_gateway::relay::router(relay))?;
        tracing::info!(socket = %socket.display(), control = %url, "model calls relayed to the control role's gateway");
        return Ok(Some(Arc::new(GatewayLink {
            store,
            keys,
            guest_port: a.guest_port,
            socket,
        })));
    }
    if !a.has_upstream() {
        return Ok(None);
    }
    let (store, keys) = open_budgets(h.db, h.data).await?;
    let events = crate::gateway_events::QueuedEvents::local(h.sessions);
    let g = build(a, store.clone(), keys.clone(), Arc::new(events), h.registry)?;
    hatchery_gateway::spawn_janitor(store.clone());
    let socket = serve_socket(h.data, model_routes(g))?;
    tracing::info!(socket = %socket.display(), guest_port = a.guest_port, "model gateway serving sandboxes");
    Ok(Some(Arc::new(GatewayLink {
        store,
        keys,
        guest_port: a.guest_port,
        socket,
    })))
}

/// The control role's gateway, if an upstream is configured: the model
/// routes under `/v1/model-gateway`, for hosts' relays only (the API key,
/// the daemon key and a sandbox id are required), budgets in the shared database, and
/// its events posted to each session's owning host.
pub async fn start_control(
    a: &GatewayArgs,
    db: &hatchery_db::Db,
    data: &Path,
    registry: &prometheus::Registry,
    mut sink: crate::gateway_events::RemoteSink,
) -> Result<Option<axum::Router>, GatewayStartError> {
    // A control_url here was refused with the configuration (rules.rs).
    if !a.has_upstream() {
        return Ok(None);
    }
    let keys_wanted = hatchery_route::relay::HostKeys {
        api_key: sink.post.api_key.clone().into(),
        daemon_key: sink.post.daemon_key.clone().into(),
    };
    let (store, keys) = open_budgets(db, data).await?;
    sink.budgets = Some(store.clone());
    // One lane per session: a session whose host is lost (until its
    // sessions are taken over) holds up only its own events.
    let events = crate::gateway_events::QueuedEvents::spawn(Arc::new(
        crate::gateway_events::Lanes::new(Arc::new(sink)),
    ));
    let g = build(a, store.clone(), keys, Arc::new(events), registry)?;
    hatchery_gateway::spawn_janitor(store);
    tracing::info!("model gateway serving the hosts' relays at /v1/model-gateway");
    Ok(Some(hatchery_gateway::relay::control_routes(
        model_routes(g),
        keys_wanted,
    )))
}

/// Only the model routes: guest code reaches this listener, so the admin
/// routes (budgets, bindings, keys) are not on it at all.
fn model_routes(g: Arc<Gateway>) -> axum::Router {
    use axum::routing::post;
    axum::Router::new()
        .route(
            "/v1/chat/completions",
            post(
                |axum::extract::State(g): axum::extract::State<Arc<Gateway>>, h, b| {
                    hatchery_gateway::calls::call(g, Flavor::OpenAi, "/v1/chat/completions", h, b)
                },
            ),
        )
        .route(
            "/v1/messages",
            post(
                |axum::extract::State(g): axum::extract::State<Arc<Gateway>>, h, b| {
                    hatchery_gateway::calls::call(g, Flavor::Anthropic, "/v1/messages", h, b)
                },
            ),
        )
        .with_state(g)
}
