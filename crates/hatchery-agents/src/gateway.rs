//! The model gateway, wired from the daemon's options (the gateway itself:
//! hatchery_gateway::embed; its events into session logs:
//! hatchery-model-events; docs/gateway.md, "In the daemon").

use hatchery_config::GatewayArgs;
use hatchery_gateway::embed::{self, EmbedError, GatewayLink, HostIdentity, Settings};
use hatchery_gateway::policy::CallPolicy;
use hatchery_model_events::{Lanes, PinnedPolicy, QueuedEvents, RemoteSink};
use hatchery_sessions::held_approvals::SessionApprovals;
use hatchery_sessions::owner_post::OwnerPost;
use std::sync::Arc;
use std::time::Duration;

fn settings(a: &GatewayArgs) -> Settings {
    Settings {
        openai_upstream: a.openai_upstream.clone(),
        anthropic_upstream: a.anthropic_upstream.clone(),
        upstream_ca_file: a.upstream_ca_file.clone(),
        upstream_key_file: a.upstream_key_file.clone(),
        prices: a.prices.clone(),
        guest_port: a.guest_port,
        max_output_tokens: a.max_output_tokens,
        reservation_ttl: Duration::from_secs(a.reservation_ttl_s),
        upstream_timeout: Duration::from_secs(a.upstream_timeout_s),
    }
}

/// A host's side: relayed to the control role with `--gateway-control-url`
/// (whose form was checked with the configuration), else served here when
/// an upstream is configured, its events into this host's sessions.
pub async fn start(
    a: &GatewayArgs,
    (db, data): (&hatchery_db::Db, &std::path::Path),
    (sessions, approvals): (Arc<hatchery_sessions::Sessions>, Arc<SessionApprovals>),
    registry: &prometheus::Registry,
    me: HostIdentity<'_>,
    policies: Arc<dyn hatchery_policy::PolicyStore>,
) -> Result<Option<Arc<GatewayLink>>, EmbedError> {
    let s = settings(a);
    let link = match &a.control_url {
        Some(url) => Some(embed::relay_sandboxes(&s, db, data, url, me).await?),
        None => {
            let policy = pinned(sessions.store(), policies, Some(approvals));
            let events = || Arc::new(QueuedEvents::local(Arc::new(sessions))) as _;
            embed::serve_sandboxes(&s, db, data, registry, events, Some(policy)).await?
        }
    };
    Ok(link.map(Arc::new))
}

/// Each model call decided by its session's pinned policy first; held
/// for a person's approval where this daemon has the session's log
/// (`approvals`), refused where it cannot hold one.
fn pinned(
    sessions: Arc<dyn hatchery_sessions::store::SessionStore>,
    policies: Arc<dyn hatchery_policy::PolicyStore>,
    approvals: Option<Arc<SessionApprovals>>,
) -> Arc<dyn CallPolicy> {
    Arc::new(PinnedPolicy {
        sessions,
        policies: Arc::new(hatchery_policy::cache::CompiledPolicies::new(policies)),
        approvals,
    })
}

/// The control role's gateway: its events posted to each session's owning
/// host, one lane per session (a session whose host is lost, until its
/// sessions are taken over, holds up only its own events).
pub async fn start_control(
    a: &GatewayArgs,
    (db, data): (&hatchery_db::Db, &std::path::Path),
    registry: &prometheus::Registry,
    post: OwnerPost,
    (sessions, policies): (
        Arc<dyn hatchery_sessions::store::SessionStore>,
        Arc<dyn hatchery_policy::PolicyStore>,
    ),
) -> Result<Option<axum::Router>, crate::AgentsError> {
    // The control role has no session logs to hold a call's question in
    // (they are on each session's host): `require_approval` is refused.
    let policy = pinned(sessions, policies, None);
    let keys = hatchery_route::relay::HostKeys {
        api_key: post.api_key.clone().into(),
        daemon_key: post.daemon_key.clone().into(),
    };
    let outcomes = hatchery_model_events::outcomes(registry);
    let events = |store| {
        let sink = RemoteSink {
            post,
            outcomes,
            budgets: Some(store),
        };
        Arc::new(QueuedEvents::spawn(Arc::new(Lanes::new(Arc::new(sink))))) as _
    };
    Ok(embed::serve_hosts(&settings(a), db, data, registry, keys, events, Some(policy)).await?)
}
