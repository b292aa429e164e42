//! The model gateway inside the daemon (docs/gateway.md, "In the daemon").
//! It runs in-process: its router is served on a Unix socket in the data
//! dir (0700, so only the daemon's own user can connect), registered as the
//! host service every sandbox reaches at `127.0.0.1:GUEST_PORT`; the relay
//! sets `X-Hatchery-Sandbox`, so the gateway trusts that header and the
//! sandbox holds no key. In-process because the sessions runner binds each
//! session's sandbox and budget directly, and the gateway's settlements and
//! refusals land in the session's event log without another hop.

use clap::Args;
use hatchery_gateway::budget::{BudgetStore, Caller, KeyStore, SqliteBudgets};
use hatchery_gateway::events::{GatewayEvent, GatewayEvents};
use hatchery_gateway::upstream::Upstream;
use hatchery_gateway::usage::Flavor;
use hatchery_gateway::Gateway;
use hatchery_sessions::events::EventKind;
use hatchery_sessions::Sessions;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::mpsc;

#[derive(Debug, Clone, Args)]
pub struct GatewayArgs {
    /// OpenAI-compatible upstream (http://host:port[/prefix] or
    /// https://host[:port][/prefix]) for the
    /// in-process model gateway. With this (or the Anthropic one) set,
    /// sessions call their model only through the gateway.
    #[arg(
        long = "gateway-openai-upstream",
        env = "HATCHERY_GATEWAY_OPENAI_UPSTREAM"
    )]
    pub openai_upstream: Option<String>,
    /// Anthropic-compatible upstream (http://host:port[/prefix]).
    #[arg(
        long = "gateway-anthropic-upstream",
        env = "HATCHERY_GATEWAY_ANTHROPIC_UPSTREAM"
    )]
    pub anthropic_upstream: Option<String>,
    /// CA bundle (PEM) for https:// upstreams (default: the system bundle).
    #[arg(
        long = "gateway-upstream-ca-file",
        env = "HATCHERY_GATEWAY_UPSTREAM_CA_FILE"
    )]
    pub upstream_ca_file: Option<PathBuf>,
    /// File with the upstream's API key; only the daemon reads it.
    #[arg(
        long = "gateway-upstream-key-file",
        env = "HATCHERY_GATEWAY_UPSTREAM_KEY_FILE"
    )]
    pub upstream_key_file: Option<PathBuf>,
    /// Price table (JSON, docs/gateway.md "Prices"); required with an upstream.
    #[arg(long = "gateway-prices", env = "HATCHERY_GATEWAY_PRICES")]
    pub prices: Option<PathBuf>,
    /// Where guest code reaches the gateway: 127.0.0.1:PORT in the sandbox.
    /// The sessions model URL default (http://127.0.0.1:9100/v1) names it.
    #[arg(id = "gateway_guest_port", value_name = "PORT", long = "gateway-guest-port", env = "HATCHERY_GATEWAY_GUEST_PORT", default_value_t = 9100,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub guest_port: u16,
    /// Largest max_tokens a call may ask for (and what a call without one gets).
    #[arg(long = "gateway-max-output-tokens", env = "HATCHERY_GATEWAY_MAX_OUTPUT_TOKENS", default_value_t = 4096,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_output_tokens: u64,
    /// Seconds a reservation lives without a settlement before the janitor
    /// frees it.
    #[arg(long = "gateway-reservation-ttl", env = "HATCHERY_GATEWAY_RESERVATION_TTL", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub reservation_ttl_s: u64,
    /// Longest the upstream may take to start answering, in seconds.
    #[arg(long = "gateway-upstream-timeout", env = "HATCHERY_GATEWAY_UPSTREAM_TIMEOUT", default_value_t = 120,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub upstream_timeout_s: u64,
}

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

/// Gateway events into session logs: one task appends them in the order
/// they happened. The queue is bounded; past it events are dropped and
/// counted in a (rate-limited) log line, never blocking a model call.
struct SessionEvents {
    tx: mpsc::Sender<GatewayEvent>,
}

const EVENT_QUEUE: usize = 4096;

impl GatewayEvents for SessionEvents {
    fn record(&self, e: GatewayEvent) {
        if self.tx.try_send(e).is_err() {
            static LIMIT: OnceLock<hatchery_core::ratelimit::LogLimiter> = OnceLock::new();
            let l = LIMIT.get_or_init(|| {
                hatchery_core::ratelimit::LogLimiter::new(Duration::from_secs(10), 1)
            });
            hatchery_core::limited_warn!(
                l,
                "gateway-events",
                "gateway event queue full; event not written to the session log"
            );
        }
    }
}

fn api(f: Flavor) -> &'static str {
    match f {
        Flavor::OpenAi => "openai",
        Flavor::Anthropic => "anthropic",
    }
}

async fn write_events(sessions: Arc<Sessions>, mut rx: mpsc::Receiver<GatewayEvent>) {
    while let Some(e) = rx.recv().await {
        let (session, res) = match e {
            GatewayEvent::Called {
                caller,
                flavor,
                model,
                input_tokens,
                output_tokens,
                charged,
                ..
            } => {
                let call = EventKind::ModelCall {
                    api: api(flavor).into(),
                    model,
                    input_tokens,
                    output_tokens,
                    tokens: charged.tokens,
                    usd_cents: charged.usd_cents,
                };
                let r = sessions
                    .record_model_call(&caller.session, call, charged.tokens, charged.usd_cents)
                    .await;
                (caller.session, r)
            }
            // Its own event (and the end of the session) comes from
            // `Exhausted`, just before.
            GatewayEvent::Refused {
                code: "budget_exhausted",
                ..
            } => continue,
            GatewayEvent::Refused {
                caller: Some(caller),
                flavor,
                code,
                message,
            } => {
                let r = sessions
                    .record_model_refused(&caller.session, api(flavor), code, &message)
                    .await;
                (caller.session, r)
            }
            // No caller: an unbound sandbox or a bad key; nothing to log it to.
            GatewayEvent::Refused { caller: None, .. } => continue,
            GatewayEvent::Exhausted { caller, scope } => {
                let msg = "a model call's worst case did not fit in what is left of the budget";
                let r = sessions
                    .record_budget_exhausted(&caller.session, &scope, msg)
                    .await;
                (caller.session, r)
            }
        };
        if let Err(e) = res {
            // A session that ended (or a caller that is no session) keeps
            // no more events.
            tracing::debug!(session = %session, error = %e, "gateway event not recorded");
        }
    }
}

fn read(p: &Path) -> Result<Vec<u8>, GatewayStartError> {
    std::fs::read(p).map_err(|e| GatewayStartError::File(p.to_path_buf(), e))
}

/// The budget and key store: with a shared `postgres://` database, its
/// tables there, so a session's spend follows it when it moves to another
/// host (a fresh per-host budget would let it spend its limit again on
/// each); otherwise DATA_DIR/gateway.db.
async fn open_budgets(
    shared_db: Option<(&str, usize)>,
    data: &Path,
) -> Result<(Arc<dyn BudgetStore>, Arc<dyn KeyStore>), GatewayStartError> {
    use hatchery_gateway::budget::BudgetError;
    use hatchery_gateway::budget_pg::PgBudgets;
    Ok(match shared_db {
        Some((dsn, pool)) => {
            let db = Arc::new(
                crate::state_db::retry_while_unreachable(
                    "gateway budgets",
                    || PgBudgets::connect(dsn, pool),
                    |e| match e {
                        BudgetError::Pool(_) => true,
                        BudgetError::Pg { source, .. } => hatchery_store::pg_unavailable(source),
                        _ => false,
                    },
                )
                .await?,
            );
            (db.clone(), db)
        }
        None => {
            let db = Arc::new(SqliteBudgets::open(&data.join("gateway.db"))?);
            (db.clone(), db)
        }
    })
}

/// Starts the gateway if an upstream is configured: its store (see
/// `open_budgets`), janitor, event writer and socket listener.
pub async fn start(
    a: &GatewayArgs,
    data: &Path,
    shared_db: Option<(&str, usize)>,
    sessions: Arc<Sessions>,
    registry: &prometheus::Registry,
) -> Result<Option<Arc<GatewayLink>>, GatewayStartError> {
    if a.openai_upstream.is_none() && a.anthropic_upstream.is_none() {
        return Ok(None);
    }
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
    let (store, keys) = open_budgets(shared_db, data).await?;
    let (tx, rx) = mpsc::channel(EVENT_QUEUE);
    tokio::spawn(write_events(sessions, rx));
    let metrics = hatchery_gateway::metrics::Metrics::default();
    for c in [
        Box::new(metrics.calls.clone()) as Box<dyn prometheus::core::Collector>,
        Box::new(metrics.reserve_seconds.clone()),
    ] {
        if let Err(e) = registry.register(c) {
            tracing::warn!(error = %e, "gateway metrics not registered");
        }
    }
    let g = Arc::new(Gateway {
        store: store.clone(),
        keys: keys.clone(),
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
        events: Arc::new(SessionEvents { tx }),
    });
    hatchery_gateway::spawn_janitor(store.clone());
    let socket = data.join("gateway.sock");
    let _ = std::fs::remove_file(&socket);
    let listener = tokio::net::UnixListener::bind(&socket)
        .map_err(|e| GatewayStartError::Listen(socket.clone(), e))?;
    let app = model_routes(g);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "gateway listener failed");
        }
    });
    tracing::info!(socket = %socket.display(), guest_port = a.guest_port, "model gateway serving sandboxes");
    Ok(Some(Arc::new(GatewayLink {
        store,
        keys,
        guest_port: a.guest_port,
        socket,
    })))
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
