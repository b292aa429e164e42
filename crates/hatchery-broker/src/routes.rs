//! Two routers. [`guest_router`] is served only on the broker's Unix
//! socket, which the daemon registers as the `broker` host service: every
//! request reaching it came through some sandbox's relay, which set
//! `X-Hatchery-Sandbox` (removing any the guest sent), so that header is
//! the caller's identity. [`operator_router`] is part of the daemon's API
//! (behind the API key) and shows the recorded calls.

use crate::error::BrokerError;
use crate::service::Broker;
use crate::wire::InvokeRequest;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::routing::{get, post};
use axum::{Json, Router};
use std::sync::Arc;

pub const IDENTITY_HEADER: &str = "x-hatchery-sandbox";

pub fn guest_router(b: Arc<Broker>) -> Router {
    Router::new()
        .route("/v1/invoke", post(invoke))
        // No work at all: a health check, and the baseline of the figures.
        .route(
            "/v1/ping",
            get(|| async { Json(serde_json::json!({"ok": true})) }),
        )
        .layer(axum::extract::DefaultBodyLimit::max(
            crate::wire::MAX_ARGS_BYTES + 4096,
        ))
        .with_state(b)
}

pub fn operator_router(b: Arc<Broker>) -> Router {
    Router::new()
        .route("/v1/sessions/{id}/broker/calls", get(calls))
        .with_state(b)
}

async fn invoke(
    State(b): State<Arc<Broker>>,
    headers: HeaderMap,
    body: Result<Json<InvokeRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<crate::wire::InvokeResult>, BrokerError> {
    let sandbox = headers
        .get(IDENTITY_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|s| !s.is_empty())
        .ok_or_else(|| BrokerError::UnknownSandbox("no sandbox identity on the request".into()))?
        .to_string();
    let Json(req) = body.map_err(|e| BrokerError::BadRequest(e.body_text()))?;
    Ok(Json(b.invoke(&sandbox, req).await?))
}

async fn calls(
    State(b): State<Arc<Broker>>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, BrokerError> {
    let calls = b.store().calls(&id).await?;
    let out: Vec<serde_json::Value> = calls
        .iter()
        .map(|c| {
            let r = crate::wire::InvokeResult::from_call(c);
            serde_json::json!({
                "seq": c.seq, "epoch": c.epoch, "tool": c.tool, "status": c.state.as_str(),
                "decision": c.decision, "rule_id": c.rule_id, "approval_id": c.approval_id,
                "arguments": serde_json::from_str::<serde_json::Value>(&c.args).unwrap_or_default(),
                "effect": c.effect.as_deref().and_then(|e| serde_json::from_str::<serde_json::Value>(e).ok()),
                "output": r.output, "created_at": c.created_at, "updated_at": c.updated_at,
            })
        })
        .collect();
    Ok(Json(serde_json::json!({ "calls": out })))
}

/// Serves the guest router on a Unix socket only root (the daemon) can
/// open; the relay connects there.
pub async fn serve_socket(b: Arc<Broker>, path: std::path::PathBuf) -> std::io::Result<()> {
    let _ = std::fs::remove_file(&path);
    let l = tokio::net::UnixListener::bind(&path)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    axum::serve(l, guest_router(b)).await
}
