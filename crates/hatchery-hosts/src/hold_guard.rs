//! A host's own refusal of new work while the operator holds it
//! (cordoned, draining): the control plane places nothing there, and this
//! answers the creates that reach the host directly (a single-host `all`
//! role, a client talking to a host) with 503 `host_cordoned` or
//! `host_draining`. Everything else (its existing sandboxes) is served.

use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hatchery_store::{HostHold, Store};
use std::sync::Arc;

#[derive(Clone)]
pub struct HoldGuard {
    pub store: Arc<dyn Store>,
    /// This host's id.
    pub me: String,
}

/// A request that creates a sandbox or a session here.
pub fn is_create(method: &Method, path: &str) -> bool {
    if method != Method::POST {
        return false;
    }
    matches!(path, "/v1/sandboxes" | "/e2b/sandboxes" | "/v1/sessions")
        || path
            .strip_prefix("/v1/snapshots/")
            .and_then(|r| r.strip_suffix("/fork"))
            .is_some_and(|id| !id.is_empty() && !id.contains('/'))
}

pub async fn refuse_when_held(State(g): State<HoldGuard>, req: Request, next: Next) -> Response {
    if !is_create(req.method(), req.uri().path()) {
        return next.run(req).await;
    }
    // A store that does not answer refuses nothing here: the create
    // itself then fails on it with its own error.
    let hold = match g.store.list_hosts().await {
        Ok(hosts) => hosts
            .into_iter()
            .find(|h| h.id == g.me)
            .map(|h| h.hold)
            .unwrap_or(HostHold::None),
        Err(_) => HostHold::None,
    };
    if hold == HostHold::None {
        return next.run(req).await;
    }
    let code = format!("host_{}", hold.as_str());
    let message = format!(
        "host {} is {}: it takes no new sandboxes or sessions (POST /v1/hosts/{}:uncordon ends it)",
        g.me,
        hold.as_str(),
        g.me
    );
    tracing::info!(host = %g.me, hold = %hold, path = req.uri().path(), "create refused: host held");
    let body = serde_json::json!({"error": {"code": code, "message": message}});
    let mut resp = (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
    resp.headers_mut()
        .insert("retry-after", HeaderValue::from_static("30"));
    resp
}

#[cfg(test)]
mod tests {
    use super::is_create;
    use axum::http::Method;

    #[test]
    fn creates_are_the_posts_that_start_something() {
        for p in [
            "/v1/sandboxes",
            "/e2b/sandboxes",
            "/v1/sessions",
            "/v1/snapshots/snap_1/fork",
        ] {
            assert!(is_create(&Method::POST, p), "{p}");
        }
        for p in [
            "/v1/sandboxes/sbx_1/exec",
            "/v1/snapshots//fork",
            "/v1/snapshots/a/b/fork",
            "/v1/hosts",
        ] {
            assert!(!is_create(&Method::POST, p), "{p}");
        }
        assert!(!is_create(&Method::GET, "/v1/sandboxes"));
    }
}
