//! The sessions API's two keys, checked before a handler runs: the API
//! key on every route, and the deployment's daemon key besides it on the
//! routes only other daemons post to. Apart from routes.rs so that the
//! handlers elsewhere (model_events.rs, broker_events.rs) need not import
//! the router.

use crate::api_state::ApiState;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

pub(crate) async fn require_key(State(st): State<ApiState>, req: Request, next: Next) -> Response {
    let given = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if !hatchery_serve::headers::constant_time_eq(given.as_bytes(), st.api_key.as_bytes()) {
        return unauthorized("missing or wrong API key");
    }
    next.run(req).await
}

/// A 401 in the API's error shape.
pub(crate) fn unauthorized(message: &str) -> Response {
    let body = serde_json::json!({"error": {"code": "unauthorized", "message": message}});
    (StatusCode::UNAUTHORIZED, axum::Json(body)).into_response()
}

/// In front of the routes other daemons post to (model and broker
/// events), before the body is read: the API key alone is every client's,
/// and with it a client could add spend, model or broker events to any
/// session's log; the daemons' own key is wanted too.
pub(crate) async fn require_daemon_key(
    State(st): State<ApiState>,
    req: Request,
    next: Next,
) -> Response {
    if !hatchery_serve::headers::daemon_key_ok(req.headers(), &st.daemon_key) {
        return unauthorized("only the deployment's daemons post here (X-Hatchery-Daemon-Key)");
    }
    next.run(req).await
}
