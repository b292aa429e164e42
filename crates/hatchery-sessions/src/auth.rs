//! The sessions API's two keys, checked before a handler runs: the API
//! key on every route, and the deployment's daemon key besides it on the
//! routes only other daemons post to. Apart from routes.rs so that the
//! handlers elsewhere (model_events.rs, broker_events.rs) need not import
//! the router.

use crate::api_state::ApiState;
use crate::error::SessionError;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hatchery_tenants::Principal;

/// The API key is the operator, who reaches every session; a tenant's
/// key (hatchery-tenants) reaches only the sessions it made: any other
/// session id answers 404 `session_not_found`, exactly as a missing one,
/// so a tenant cannot learn what others have. The caller's [`Principal`]
/// goes into the request's extensions for the handlers (create stamps it,
/// list filters on it).
pub(crate) async fn require_key(
    State(st): State<ApiState>,
    mut req: Request,
    next: Next,
) -> Response {
    let given = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    let principal =
        if hatchery_serve::headers::constant_time_eq(given.as_bytes(), st.api_key.as_bytes()) {
            Principal::Operator
        } else {
            let Some(tenants) = &st.tenants else {
                return unauthorized("missing or wrong API key");
            };
            match tenants.resolve(given).await {
                Ok(Some(p)) => p,
                Ok(None) => return unauthorized("missing or wrong API key"),
                Err(e) => return SessionError::Tenants(e).into_response(),
            }
        };
    if let (Principal::Tenant(t), Some(id)) = (&principal, session_in_path(req.uri().path())) {
        if let Err(e) = owned_by(&st, id, t).await {
            return e.into_response();
        }
    }
    req.extensions_mut().insert(principal);
    next.run(req).await
}

/// The session id a `/v1/sessions/{id}…` path names (`{id}:cancel`
/// included), `None` for the collection.
fn session_in_path(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/v1/sessions/")?;
    let seg = rest.split('/').next().unwrap_or("");
    let id = seg.split(':').next().unwrap_or("");
    (!id.is_empty()).then_some(id)
}

/// `Ok` when session `id` is `tenant`'s; 404 for another's or a missing
/// one alike.
async fn owned_by(st: &ApiState, id: &str, tenant: &str) -> Result<(), SessionError> {
    let s = st.sessions.core.store.get(id).await?;
    if s.spec.tenant.as_deref() == Some(tenant) {
        Ok(())
    } else {
        Err(SessionError::NotFound(id.to_string()))
    }
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

#[cfg(test)]
mod tests {
    use super::session_in_path;

    #[test]
    fn the_session_of_a_path_is_found_in_each_route_shape() {
        let cases = [
            ("/v1/sessions", None),
            ("/v1/sessions/", None),
            ("/v1/sessions/ses_a", Some("ses_a")),
            ("/v1/sessions/ses_a:cancel", Some("ses_a")),
            ("/v1/sessions/ses_a/events", Some("ses_a")),
            ("/v1/sessions/ses_a/approvals/apr_b", Some("ses_a")),
            ("/v1/sessions/ses_a/blobs/x", Some("ses_a")),
            ("/v1/sandboxes/ses_a", None),
        ];
        for (path, want) in cases {
            assert_eq!(session_in_path(path), want, "{path}");
        }
    }
}
