//! The middleware in front of a host's API (roles `all` and `host` on a
//! shared store): a request for a sandbox or snapshot another host owns
//! goes there, or is answered 503 with Retry-After if that host is lost
//! or unreachable.

use crate::{
    forward, scope_of_request, Directory, Location, RouteError, RouteMetrics, Scope, FORWARDED_BY,
};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

#[derive(Clone)]
pub struct HostRouting {
    pub directory: Arc<dyn Directory>,
    /// This host's id.
    pub me: String,
    pub api_key: Arc<str>,
    pub metrics: RouteMetrics,
    /// The deployment's daemon key, on the layer of a preview listener:
    /// added to what it forwards, because an owner serves guest content
    /// on its API listener only to another daemon ([`with_daemon_key`]).
    /// `None` on an API listener.
    pub forward_key: Option<Arc<str>>,
}

/// Marks a request forwarded from a preview listener with the daemon key
/// (replacing whatever the client sent under that name): the owner's API
/// listener serves a preview only with it, and removes it before the
/// request reaches the guest.
pub fn with_daemon_key(mut req: Request, key: Option<&str>) -> Request {
    if let Some(v) = key.and_then(|k| axum::http::HeaderValue::from_str(k).ok()) {
        req.headers_mut()
            .insert(hatchery_serve::headers::DAEMON_KEY_HEADER, v);
    }
    req
}

/// Forwarding is for callers with the API key (Bearer, or E2B's
/// `X-API-Key`). The exceptions carry a credential only the owner, whose
/// secret signed it, can check: the pty WebSocket (a terminal token), E2B's
/// sandbox traffic (`X-Access-Token`) and preview URLs (the token is the
/// path).
pub(crate) fn may_forward(req: &Request, api_key: &str) -> bool {
    let path = req.uri().path();
    hatchery_serve::headers::api_key_ok(req.headers(), api_key)
        || path.ends_with("/pty")
        || path.starts_with("/e2b/sandbox/")
        || path == "/e2b/sandbox"
        || path.starts_with("/preview/")
}

/// What the directory says about the request's sandbox or snapshot;
/// `None` for requests without one.
pub(crate) async fn locate(
    dir: &dyn Directory,
    scope: Scope,
) -> Option<Result<(Location, String), RouteError>> {
    let (loc, what) = match scope {
        Scope::Sandbox(id) => (dir.sandbox(&id).await, format!("sandbox {id}")),
        Scope::Snapshot(id) => (dir.snapshot(&id).await, format!("snapshot {id}")),
        Scope::Session(id) => (dir.session(&id).await, format!("session {id}")),
        Scope::Other => return None,
    };
    Some(loc.map(|l| (l, what)))
}

pub async fn route(State(r): State<HostRouting>, req: Request, next: Next) -> Response {
    // Forwarded once already: this host answers, whatever it knows.
    if req.headers().contains_key(FORWARDED_BY) || !may_forward(&req, &r.api_key) {
        return next.run(req).await;
    }
    // Taken before any await: the request itself is not Sync.
    let scope = scope_of_request(req.uri().path(), req.headers());
    match locate(r.directory.as_ref(), scope).await {
        None | Some(Ok((Location::Here | Location::Unknown | Location::Anywhere, _))) => {
            next.run(req).await
        }
        Some(Ok((Location::At { host, url }, what))) => {
            let req = with_daemon_key(req, r.forward_key.as_deref());
            match forward::forward_watched(r.directory.as_ref(), &host, &url, &r.me, &what, req)
                .await
            {
                Ok(resp) => {
                    r.metrics.count("forwarded");
                    resp
                }
                Err(e) => {
                    r.metrics.count("unreachable");
                    e.into_response()
                }
            }
        }
        Some(Ok((Location::Lost { host }, what))) => {
            r.metrics.count("host_lost");
            RouteError::HostLost { host, what }.into_response()
        }
        Some(Ok((Location::Starting { host }, what))) => {
            r.metrics.count("host_starting");
            RouteError::HostStarting { host, what }.into_response()
        }
        Some(Ok((
            Location::Gone {
                host,
                at_ms,
                reason,
            },
            what,
        ))) => {
            r.metrics.count("sandbox_lost");
            let e = RouteError::SandboxLost {
                host,
                what,
                at_ms,
                reason,
            };
            match crate::error::is_e2b(req.uri().path()) {
                true => e.into_e2b_response(),
                false => e.into_response(),
            }
        }
        Some(Err(e)) => e.into_response(),
    }
}
