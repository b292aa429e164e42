//! The `control` role's API: it runs no sandboxes. A create (sandbox,
//! session, fork of a shared snapshot) is placed by [`placement::rank`]
//! (hosts that are full, lost or answer 503 are skipped); a request for a
//! sandbox or snapshot goes to its owner; anything else (lists, templates)
//! to a live host, since every host answers those from the shared store.

use crate::layer::{locate, may_forward};
use crate::placement::{self, Want};
use crate::{forward, Directory, HostSlot, Location, RouteError, RouteMetrics};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use std::sync::Arc;

/// Largest body the control plane buffers for a request without one
/// owner (a create, a template build: it may go to more than one host);
/// the hosts' own JSON limit is the same. Larger: 413 `too_large`.
pub const MAX_BUFFERED_BODY: usize = 2 << 20;

#[derive(Clone)]
pub struct ControlState {
    pub directory: Arc<dyn Directory>,
    pub me: String,
    pub api_key: Arc<str>,
    pub metrics: RouteMetrics,
    pub registry: prometheus::Registry,
    /// The template a create without one asks for (placement prefers hosts
    /// with it warm).
    pub default_template: Arc<str>,
    /// The daemon key, on the control role's preview listener: added to
    /// every request it forwards, to an owner or (a token naming no
    /// sandbox) to any host, which then answers it as a preview (see
    /// [`crate::layer::with_daemon_key`]).
    pub forward_key: Option<Arc<str>>,
    /// Tenant keys, forwarded to the hosts like the API key once
    /// recognised (`None`: refused here, 401).
    pub tenant_keys: Option<Arc<dyn crate::TenantKeys>>,
}

pub fn router(st: ControlState) -> Router {
    Router::new().fallback(handle).with_state(st)
}

async fn handle(State(st): State<ControlState>, req: Request) -> Response {
    let e2b = crate::error::is_e2b(req.uri().path());
    match route(&st, req).await {
        Ok(r) => r,
        Err(e) if e2b => e.into_e2b_response(),
        Err(e) => e.into_response(),
    }
}

async fn route(st: &ControlState, req: Request) -> Result<Response, RouteError> {
    let path = req.uri().path().to_string();
    if path == "/healthz" {
        return Ok(axum::Json(serde_json::json!({"ok": true, "role": "control"})).into_response());
    }
    let Some(caller) = may_forward(&req, &st.api_key, st.tenant_keys.as_ref()).await? else {
        return Err(RouteError::Unauthorized);
    };
    if path == "/metrics" {
        // The operator's alone, like a host's /metrics.
        if !hatchery_serve::headers::api_key_ok(req.headers(), &st.api_key) {
            return Err(RouteError::Unauthorized);
        }
        return Ok(metrics_text(&st.registry).into_response());
    }
    if req.method() == Method::POST && (path == "/v1/sandboxes" || path == "/e2b/sandboxes") {
        return place(st, req, Create::Sandbox).await;
    }
    if req.method() == Method::POST && path == "/v1/sessions" {
        return place(st, req, Create::Session).await;
    }
    let scope = crate::scope_of_request(&path, req.headers());
    let forked = match &scope {
        crate::Scope::Snapshot(id) => Some(id.clone()),
        _ => None,
    };
    match locate(st.directory.as_ref(), scope, &caller).await {
        // A shared snapshot: its fork needs room, like a create; a read
        // or delete any host answers.
        Some(Ok((Location::Anywhere, _))) if req.method() == Method::POST => {
            place(st, req, Create::Fork(forked)).await
        }
        Some(Ok((Location::Anywhere, _))) => any_host(st, req).await,
        Some(Ok((Location::At { host, url }, what))) => {
            let req = crate::layer::with_daemon_key(req, st.forward_key.as_deref());
            let r =
                forward::forward_watched(st.directory.as_ref(), &host, &url, &st.me, &what, req)
                    .await;
            // Counted after the forward, so a failed one is not "forwarded".
            st.metrics.count(match &r {
                Ok(_) => "forwarded",
                Err(RouteError::HostLost { .. }) => "host_lost",
                Err(_) => "unreachable",
            });
            r
        }
        Some(Ok((Location::Lost { host }, what))) => {
            st.metrics.count("host_lost");
            Err(RouteError::HostLost { host, what })
        }
        Some(Ok((Location::Starting { host }, what))) => {
            st.metrics.count("host_starting");
            Err(RouteError::HostStarting { host, what })
        }
        Some(Ok((
            Location::Gone {
                host,
                at_ms,
                reason,
            },
            what,
        ))) => {
            st.metrics.count("sandbox_lost");
            Err(RouteError::SandboxLost {
                host,
                what,
                at_ms,
                reason,
            })
        }
        Some(Ok((Location::Here | Location::Unknown, what))) => {
            Err(if what.starts_with("snapshot") {
                RouteError::NotFound("snapshot_not_found", what)
            } else if what.starts_with("session") {
                RouteError::NotFound("session_not_found", what)
            } else {
                RouteError::NotFound("sandbox_not_found", what)
            })
        }
        Some(Err(e)) => Err(e),
        None => any_host(st, req).await,
    }
}

/// A request any live host answers from the shared store.
async fn any_host(st: &ControlState, req: Request) -> Result<Response, RouteError> {
    let hosts = by_preference(st.directory.hosts().await?);
    if hosts.is_empty() {
        return Err(RouteError::NoHost);
    }
    let (parts, body) = buffered(req).await?;
    try_hosts(st, &parts, &body, &hosts, false)
        .await
        .ok_or(RouteError::NoHost)
}

/// Routed hosts (ready, cordoned or draining: not starting or lost),
/// most free capacity first (then by id, so ties alternate as counts
/// change rather than by chance).
pub fn by_preference(hosts: Vec<HostSlot>) -> Vec<HostSlot> {
    let mut live: Vec<HostSlot> = hosts.into_iter().filter(|h| h.routed).collect();
    live.sort_by(|a, b| b.free().cmp(&a.free()).then_with(|| a.id.cmp(&b.id)));
    live
}

/// What is being placed.
#[derive(Clone, PartialEq, Eq)]
enum Create {
    Sandbox,
    /// A fork of a shared snapshot (its id): restores the snapshot, or
    /// claims one of its forks where a warm pool of it is parked.
    Fork(Option<String>),
    /// A session: it queues for a slot on its host, so a host without free
    /// room still takes it when no host has any.
    Session,
}

/// A create goes to the hosts that suit it best ([`placement::rank`]).
async fn place(st: &ControlState, req: Request, what: Create) -> Result<Response, RouteError> {
    let (parts, body) = buffered(req).await?;
    let mut want = Want::of_body(&body, &st.default_template);
    if let Create::Fork(snapshot) = &what {
        // Not the template's checkpoint: the snapshot's own pool, if any.
        want.template = snapshot
            .as_deref()
            .map(placement::snapshot_key)
            .unwrap_or_default();
    }
    if what == Create::Session {
        if let Some(env) = placement::environment_of(&body) {
            environment_want(st, &env, &mut want).await;
        }
    }
    let all = st.directory.hosts().await?;
    let tenant_live = match &want.tenant {
        Some(t) => st.directory.tenant_live(t).await?,
        None => Default::default(),
    };
    let mut hosts = placement::rank(all.clone(), &want, &tenant_live);
    if hosts.is_empty() && what == Create::Session {
        // Queued on a full host rather than refused; never on a held one.
        hosts = by_preference(all.iter().filter(|h| h.placeable).cloned().collect());
    }
    match try_hosts(st, &parts, &body, &hosts, true).await {
        Some(resp) => {
            st.metrics.count("placed");
            Ok(resp)
        }
        // Nobody to ask: every live host cordoned, draining or starting
        // says so rather than "full".
        None if !all.iter().any(|h| h.placeable) => {
            st.metrics.count("no_ready_host");
            Err(RouteError::NoReadyHost)
        }
        None => {
            st.metrics.count("no_capacity");
            Err(RouteError::NoCapacity)
        }
    }
}

/// A session from environment `env` forks its current version's
/// snapshot, not the template's checkpoint: hosts with a warm pool of that
/// snapshot come first, then (a snapshot on one host's disk) its holder.
/// A preference only: when the store cannot tell, the usual rules place
/// it, and the chosen host answers for the environment (404, 409).
async fn environment_want(st: &ControlState, env: &str, want: &mut Want) {
    let snap = match st.directory.environment_snapshot(env).await {
        Ok(Some(snap)) => snap,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!(environment = %env, error = %e, "placing a session without its environment's snapshot");
            return;
        }
    };
    want.template = placement::snapshot_key(&snap);
    match st.directory.snapshot(&snap).await {
        Ok(Location::At { host, .. }) => want.holder = Some(host),
        // Shared (any host restores it at the same cost), or its holder
        // is not placeable anyway.
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(environment = %env, snapshot = %snap, error = %e, "placing a session without its snapshot's location")
        }
    }
}

/// The request with its body read whole (up to [`MAX_BUFFERED_BODY`]),
/// since it may go to more than one host.
async fn buffered(req: Request) -> Result<(axum::http::request::Parts, bytes::Bytes), RouteError> {
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, MAX_BUFFERED_BODY)
        .await
        .map_err(|_| RouteError::TooLarge(MAX_BUFFERED_BODY))?;
    Ok((parts, body))
}

/// Sends the request to each of `hosts` in turn until one answers. A host
/// that cannot be reached (stopped since its last heartbeat) is skipped;
/// with `skip_503`, so is one that answers 503 (full by its own count,
/// fenced, its store down), and if every one did, the last such answer is
/// passed on. Any other answer, success or a 4xx about the request itself,
/// is the answer. `None`: nobody answered.
async fn try_hosts(
    st: &ControlState,
    parts: &axum::http::request::Parts,
    body: &bytes::Bytes,
    hosts: &[HostSlot],
    skip_503: bool,
) -> Option<Response> {
    let mut last = None;
    for h in hosts {
        let mut r = Request::from_parts(parts.clone(), Body::from(body.clone()));
        r.extensions_mut().clear();
        let r = crate::layer::with_daemon_key(r, st.forward_key.as_deref());
        match forward::forward(&h.id, &h.url, &st.me, r).await {
            Ok(resp) if skip_503 && resp.status() == StatusCode::SERVICE_UNAVAILABLE => {
                tracing::info!(host = %h.id, "host answered 503; trying the next");
                last = Some(resp);
            }
            Ok(resp) => return Some(resp),
            Err(e) => {
                tracing::warn!(host = %h.id, error = %e, "host unreachable; trying the next");
            }
        }
    }
    last
}

fn metrics_text(reg: &prometheus::Registry) -> String {
    use prometheus::Encoder;
    let mut buf = Vec::new();
    let _ = prometheus::TextEncoder::new().encode(&reg.gather(), &mut buf);
    String::from_utf8(buf).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(id: &str, cap: u32, live: u32, alive: bool) -> HostSlot {
        HostSlot {
            id: id.into(),
            url: format!("http://{id}"),
            capacity: cap,
            live,
            alive,
            routed: alive,
            placeable: alive,
            warm: vec![],
        }
    }

    #[test]
    fn most_free_first_lost_hosts_never() {
        let p = by_preference(vec![
            slot("a", 4, 3, true),
            slot("b", 4, 1, true),
            slot("c", 8, 0, false),
            slot("d", 4, 1, true),
        ]);
        let ids: Vec<&str> = p.iter().map(|h| h.id.as_str()).collect();
        assert_eq!(ids, ["b", "d", "a"]);
        assert_eq!(slot("x", 2, 5, true).free(), 0);
    }
}
