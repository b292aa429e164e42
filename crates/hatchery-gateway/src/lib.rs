//! The model gateway: OpenAI-compatible `/v1/chat/completions` and
//! Anthropic-compatible `/v1/messages` in front of an operator-configured
//! upstream. Callers present a gateway key (issued per session, stored
//! hashed) instead of the upstream's key, which only the gateway holds.
//! Every call reserves its worst case against the caller's budgets first
//! and settles what it actually cost after (`budget.rs`).

pub mod admin;
pub mod answer;
pub mod budget;
pub mod calls;
pub mod embed;
pub mod errors;
pub mod estimate;
pub mod events;
pub mod keepalive;
pub mod metrics;
pub mod policy;
pub mod pricing;
pub mod relay;
pub mod settle;
pub mod store;
pub mod upstream;
pub mod usage;

use axum::routing::{get, post, put};
use axum::Router;
use std::sync::Arc;

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

pub struct Gateway {
    pub store: Arc<dyn budget::BudgetStore>,
    pub keys: Arc<dyn budget::KeyStore>,
    pub prices: pricing::Prices,
    pub openai: Option<upstream::Upstream>,
    pub anthropic: Option<upstream::Upstream>,
    /// Largest max-tokens a call may ask for; also what a call that asks
    /// for none is given.
    pub max_output_tokens: u64,
    /// Largest request body.
    pub max_body: usize,
    pub reservation_ttl_ms: u64,
    /// Accept the daemon's `X-Hatchery-Sandbox` header as the caller's
    /// identity. Only for a gateway that nothing but the daemon's relay can
    /// reach (sandboxes cannot reach host addresses; see docs/gateway.md).
    pub trust_sandbox_header: bool,
    /// Bearer key of the admin routes (budgets, keys).
    pub admin_key: String,
    pub metrics: metrics::Metrics,
    pub events: Arc<dyn events::GatewayEvents>,
    /// The session's pinned policy, asked before each call is reserved
    /// (`None`: budgets alone decide).
    pub policy: Option<Arc<dyn policy::CallPolicy>>,
}

/// Every route of the gateway.
pub fn router(g: Arc<Gateway>) -> Router {
    Router::new()
        .route(
            "/v1/chat/completions",
            post(
                |axum::extract::State(g): axum::extract::State<Arc<Gateway>>, h, b| {
                    calls::call(g, usage::Flavor::OpenAi, "/v1/chat/completions", h, b)
                },
            ),
        )
        .route(
            "/v1/messages",
            post(
                |axum::extract::State(g): axum::extract::State<Arc<Gateway>>, h, b| {
                    calls::call(g, usage::Flavor::Anthropic, "/v1/messages", h, b)
                },
            ),
        )
        .route(
            "/admin/budgets/{scope}",
            put(admin::set_budget).get(admin::get_budget),
        )
        .route("/admin/keys", post(admin::issue_key))
        .route(
            "/admin/sandboxes/{id}",
            put(admin::bind_sandbox).delete(admin::unbind_sandbox),
        )
        .route("/metrics", get(admin::metrics))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(g)
}

/// Charges expired reservations whole (left by calls that never settled: a
/// crash between reserve and settle, when the upstream may have billed
/// the call) once a second, until the process ends, and reports each as
/// `Expired` to its session. By the store's clock, which reservations are
/// stamped with too.
pub fn spawn_janitor(store: Arc<dyn budget::BudgetStore>, events: Arc<dyn events::GatewayEvents>) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
        loop {
            tick.tick().await;
            let now = match store.now_ms().await {
                Ok(n) => n,
                Err(e) => {
                    tracing::error!(error = %e, "reading the store's clock failed");
                    continue;
                }
            };
            match store.expire(now).await {
                Ok(expired) => {
                    for e in expired {
                        tracing::warn!(reservation = %e.id, tokens = e.charged.tokens,
                            usd_cents = e.charged.usd_cents,
                            "a reservation outlived its call (its process died?): charged whole");
                        if let Some(caller) = e.caller() {
                            events.record(events::GatewayEvent::Expired {
                                caller,
                                reservation: e.id,
                                charged: e.charged,
                            });
                        }
                    }
                }
                Err(e) => tracing::error!(error = %e, "expiring reservations failed"),
            }
        }
    });
}
