//! The agent platform on a host (`--role all` or `host`): the sessions
//! service and its routes, the model gateway and egress proxy plugged into
//! its runner and registered as host services, and the tool broker.

use crate::AgentsError;
use hatchery_config::DaemonArgs;
use hatchery_sessions::egress::EgressConfig;
use hatchery_sessions::Sessions;
use std::sync::Arc;

/// What the daemon already opened that the agent platform runs on.
pub struct HostParts<'a> {
    pub args: &'a DaemonArgs,
    pub data: &'a std::path::Path,
    pub db: &'a hatchery_db::Db,
    pub manager: &'a Arc<hatchery_core::Manager>,
    /// The API key and the daemon key.
    pub keys: (&'a str, &'a str),
    pub session_store: Arc<dyn hatchery_sessions::store::SessionStore>,
    pub policies: Arc<dyn hatchery_policy::PolicyStore>,
    pub secrets: hatchery_secrets::Secrets,
    pub tenants: Arc<hatchery_tenants::Tenants>,
}

/// The started platform: its routes and the sessions service (for
/// recovery, hand-over and adoption, which the daemon schedules).
pub struct OnHost {
    /// `/v1/sessions`, `/v1/environments` and their kin (own auth).
    pub routes: axum::Router,
    /// The broker's operator routes (served behind the API's auth).
    pub broker_operator: axum::Router,
    pub sessions: Arc<Sessions>,
    /// E2B's header transforms over this host's egress proxy; `None` when
    /// the proxy is off (then E2B's `network.rules` are refused).
    pub e2b_headers: Option<Arc<dyn hatchery_e2b_backend::headers::EgressHeaders>>,
}

/// Builds the sessions service, wires its gateway, proxy and broker, and
/// re-binds the sandboxes of sessions that hold one (after a restart).
pub async fn start_host(p: HostParts<'_>) -> Result<OnHost, AgentsError> {
    let (routes, sessions) = crate::sessions::build(
        p.args,
        p.session_store.clone(),
        p.keys,
        &p.manager.metrics.registry,
        Arc::new(hatchery_broker::catalog::StorePolicies(p.policies.clone())),
        crate::sessions::open_environments(p.db).await?,
        p.tenants.clone(),
    )?;
    let egress = wire_services(&p, &sessions).await?;
    let e2b_headers = egress
        .and_then(|e| crate::e2b_headers::E2bHeaders::new(p.secrets.clone(), e))
        .map(|h| Arc::new(h) as Arc<dyn hatchery_e2b_backend::headers::EgressHeaders>);
    // On a host that relays to the control role's broker, no broker here.
    let broker_operator = hatchery_broker::embed::start_host(
        &crate::broker::settings(p.args, (p.data, p.db), p.keys, &p.manager.metrics.registry),
        sessions.clone(),
        p.policies.clone(),
    )
    .await?;
    Ok(OnHost {
        routes,
        broker_operator,
        sessions,
        e2b_headers,
    })
}

/// The in-process model gateway and egress proxy, each registered as a
/// host service on a Unix socket in the data dir, and plugged into the
/// sessions runner (docs/sessions.md, "Model gateway" and "Egress").
/// The egress proxy's link, when it runs.
async fn wire_services(
    p: &HostParts<'_>,
    sessions: &Arc<Sessions>,
) -> Result<Option<Arc<hatchery_sessions::egress::EgressLink>>, AgentsError> {
    let HostParts {
        args,
        data,
        db,
        manager,
        keys: (api_key, daemon_key),
        ..
    } = *p;
    let (policies, tenants) = (p.policies.clone(), p.tenants.clone());
    use hatchery_core::host_services::{HostAddr, HostService, Identity};
    let me = hatchery_gateway::embed::HostIdentity {
        api_key,
        daemon_key,
        host_id: manager.host_id(),
    };
    // One set of held questions for the proxy's connections and the
    // gateway's model calls: the same cap, one remembered set per session.
    let approvals = hatchery_sessions::held_approvals::SessionApprovals::new(sessions.clone());
    let gateway = crate::gateway::start(
        &args.gateway,
        (db, data),
        (sessions.clone(), approvals.clone()),
        &manager.metrics.registry,
        me,
        policies.clone(),
    )
    .await?;
    if let Some(g) = &gateway {
        manager.add_host_service(HostService {
            name: "gateway".into(),
            guest_port: g.guest_port,
            addr: HostAddr::Unix(g.socket.clone()),
            identity: Identity::HttpHeader,
        })?;
    }
    let egress = hatchery_sessions::egress::start(
        &EgressConfig {
            guest_port: args.egress.guest_port,
            max_tunnels: args.egress.max_tunnels as usize,
            max_per_session: args.egress.max_per_session as usize,
            idle: std::time::Duration::from_secs(args.egress.idle_s),
            denied_interval: std::time::Duration::from_secs(args.egress.denied_interval_s),
        },
        data,
        sessions.clone(),
        policies,
        &manager.metrics.registry,
        crate::hooks::interception(args, data, p.secrets.clone())?,
        approvals,
    )?;
    let hooks = Arc::new(crate::hooks::HostHooks {
        gateway,
        egress: egress.clone(),
        tenants,
        policies: Arc::new(hatchery_policy::cache::CompiledPolicies::new(
            p.policies.clone(),
        )),
    });
    // After a restart: the proxy's map is in memory; fill it before the
    // runners re-attach (they bind again, idempotently).
    use hatchery_sessions::hooks::SessionHooks;
    for s in sessions.holding_sandboxes().await? {
        if let Some(sbx) = &s.sandbox_id {
            if let Err(e) = hooks.bind(&s, sbx).await {
                tracing::warn!(session = %s.id, error = %e, "binding after restart failed");
            }
        }
    }
    sessions.set_hooks(hooks);
    // Registered once bound: the first connection a guest makes finds its
    // session.
    if let Some(e) = &egress {
        manager.add_host_service(HostService {
            name: "egress".into(),
            guest_port: e.guest_port,
            addr: HostAddr::Unix(e.socket.clone()),
            identity: Identity::ProxyV1,
        })?;
    }
    Ok(egress)
}
