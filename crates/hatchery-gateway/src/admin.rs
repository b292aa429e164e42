//! The operator's side: budgets per scope, gateway keys, metrics. Bearer
//! auth with the admin key; errors in Hatchery's JSON shape.

use crate::budget::{BudgetError, Caller};
use crate::calls::key_hash;
use crate::Gateway;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;

/// Longest a gateway key may live.
pub const MAX_KEY_TTL_SECONDS: u64 = 30 * 24 * 3600;

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("missing or wrong admin key")]
    Unauthorized,
    #[error("{0}")]
    BadRequest(String),
    #[error("no budget for scope {0}")]
    NotFound(String),
    #[error(transparent)]
    Store(BudgetError),
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        let (status, code) = match &self {
            AdminError::Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized"),
            AdminError::BadRequest(_) => (StatusCode::BAD_REQUEST, "invalid_request"),
            AdminError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            AdminError::Store(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        let message = if status.is_server_error() {
            let rid = format!("req_{:016x}", rand::random::<u64>());
            tracing::error!(request_id = %rid, error = %self, "admin call failed");
            format!("internal error (request id {rid})")
        } else {
            self.to_string()
        };
        (
            status,
            Json(json!({"error": {"code": code, "message": message}})),
        )
            .into_response()
    }
}

fn authorize(g: &Gateway, h: &HeaderMap) -> Result<(), AdminError> {
    let presented = h
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    // Compare hashes, not the keys: no early exit on the first bad byte.
    match presented {
        Some(k) if key_hash(k) == key_hash(&g.admin_key) => Ok(()),
        _ => Err(AdminError::Unauthorized),
    }
}

fn valid_id(s: &str) -> bool {
    (1..=128).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// `session:<id>` or `tenant:<id>`.
fn valid_scope(s: &str) -> bool {
    match s.split_once(':') {
        Some(("session" | "tenant", id)) => valid_id(id),
        _ => false,
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    tokens: Option<u64>,
    usd_cents: Option<u64>,
}

pub async fn set_budget(
    State(g): State<Arc<Gateway>>,
    h: HeaderMap,
    Path(scope): Path<String>,
    body: Result<Json<Limits>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, AdminError> {
    authorize(&g, &h)?;
    if !valid_scope(&scope) {
        return Err(AdminError::BadRequest(format!(
            "scope {scope:?} must be session:<id> or tenant:<id> (id: 1-128 of A-Z a-z 0-9 _ - .)"
        )));
    }
    let Json(l) = body.map_err(|e| AdminError::BadRequest(e.body_text()))?;
    let b = g
        .store
        .set_limits(&scope, l.tokens, l.usd_cents)
        .await
        .map_err(AdminError::Store)?;
    Ok(Json(b).into_response())
}

pub async fn get_budget(
    State(g): State<Arc<Gateway>>,
    h: HeaderMap,
    Path(scope): Path<String>,
) -> Result<Response, AdminError> {
    authorize(&g, &h)?;
    match g.store.get(&scope).await {
        Ok(b) => Ok(Json(b).into_response()),
        Err(BudgetError::UnknownScope(s)) => Err(AdminError::NotFound(s)),
        Err(e) => Err(AdminError::Store(e)),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyRequest {
    session: String,
    tenant: Option<String>,
    ttl_seconds: Option<u64>,
}

pub async fn issue_key(
    State(g): State<Arc<Gateway>>,
    h: HeaderMap,
    body: Result<Json<KeyRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, AdminError> {
    authorize(&g, &h)?;
    let Json(r) = body.map_err(|e| AdminError::BadRequest(e.body_text()))?;
    if !valid_id(&r.session) || r.tenant.as_deref().is_some_and(|t| !valid_id(t)) {
        return Err(AdminError::BadRequest(
            "session and tenant must be 1-128 of A-Z a-z 0-9 _ - .".into(),
        ));
    }
    let ttl = r.ttl_seconds.unwrap_or(24 * 3600);
    if !(1..=MAX_KEY_TTL_SECONDS).contains(&ttl) {
        return Err(AdminError::BadRequest(format!(
            "ttl_seconds must be between 1 and {MAX_KEY_TTL_SECONDS}"
        )));
    }
    let key = format!("hxg_{:032x}", rand::random::<u128>());
    let caller = Caller {
        session: r.session,
        tenant: r.tenant,
    };
    g.keys
        .add_key(&key_hash(&key), &caller, crate::now_ms() + ttl * 1000)
        .await
        .map_err(AdminError::Store)?;
    Ok((
        StatusCode::CREATED,
        Json(
            json!({"key": key, "session": caller.session, "tenant": caller.tenant,
                    "expires_in_seconds": ttl}),
        ),
    )
        .into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Binding {
    session: String,
    tenant: Option<String>,
}

/// Binds sandbox `id` to a session: its relayed calls are charged there.
pub async fn bind_sandbox(
    State(g): State<Arc<Gateway>>,
    h: HeaderMap,
    Path(id): Path<String>,
    body: Result<Json<Binding>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, AdminError> {
    authorize(&g, &h)?;
    let Json(b) = body.map_err(|e| AdminError::BadRequest(e.body_text()))?;
    if !valid_id(&id) || !valid_id(&b.session) || b.tenant.as_deref().is_some_and(|t| !valid_id(t))
    {
        return Err(AdminError::BadRequest(
            "sandbox, session and tenant must be 1-128 of A-Z a-z 0-9 _ - .".into(),
        ));
    }
    let caller = Caller {
        session: b.session,
        tenant: b.tenant,
    };
    g.keys
        .bind_sandbox(&id, &caller)
        .await
        .map_err(AdminError::Store)?;
    Ok(
        Json(json!({"sandbox": id, "session": caller.session, "tenant": caller.tenant}))
            .into_response(),
    )
}

pub async fn unbind_sandbox(
    State(g): State<Arc<Gateway>>,
    h: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, AdminError> {
    authorize(&g, &h)?;
    g.keys
        .unbind_sandbox(&id)
        .await
        .map_err(AdminError::Store)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

pub async fn metrics(State(g): State<Arc<Gateway>>) -> String {
    use prometheus::Encoder;
    let mut out = Vec::new();
    let _ = prometheus::TextEncoder::new().encode(&g.metrics.registry.gather(), &mut out);
    String::from_utf8(out).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes() {
        assert!(valid_scope("session:ses_1"));
        assert!(valid_scope("tenant:acme.co"));
        for bad in ["session:", "user:x", "session", "tenant:a/b", "session:a b"] {
            assert!(!valid_scope(bad), "{bad}");
        }
    }
}
