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

pub use hatchery_serve::headers::SANDBOX_HEADER as IDENTITY_HEADER;

pub fn guest_router(b: Arc<Broker>) -> Router {
    Router::new()
        .route("/v1/invoke", post(invoke))
        .route("/v1/tools", get(tools))
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
        .route("/v1/sessions/{id}/tool-calls/{seq}/resolve", post(resolve))
        .with_state(b)
}

/// The sandbox the relay says the request came from (403
/// `unknown_sandbox` without one).
fn identity(headers: &HeaderMap) -> Result<String, BrokerError> {
    Ok(headers
        .get(IDENTITY_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|s| !s.is_empty())
        .ok_or_else(|| BrokerError::UnknownSandbox("no sandbox identity on the request".into()))?
        .to_string())
}

async fn invoke(
    State(b): State<Arc<Broker>>,
    headers: HeaderMap,
    body: Result<Json<InvokeRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<crate::wire::InvokeResult>, BrokerError> {
    let sandbox = identity(&headers)?;
    let Json(req) = body.map_err(|e| BrokerError::BadRequest(e.body_text()))?;
    Ok(Json(b.invoke(&sandbox, req).await?))
}

/// The tools an agent may ask for: the broker's own, then each MCP
/// server's (what the server says about them is under `untrusted`: data
/// for the agent, never policy), and the servers that are down. Only a
/// running session's sandbox is told (issue 31, finding 6: the names and
/// descriptions of the operator's MCP servers are not for every sandbox
/// on the host); the refusal is the same as `/v1/invoke`'s.
async fn tools(
    State(b): State<Arc<Broker>>,
    headers: HeaderMap,
) -> Result<Json<serde_json::Value>, BrokerError> {
    b.caller(&identity(&headers)?).await?;
    let mut tools: Vec<serde_json::Value> = crate::wire::TOOLS
        .iter()
        .map(|t| serde_json::json!({"name": t, "server": null}))
        .collect();
    let (mcp, errors) = b.mcp().catalog().await;
    tools.extend(mcp);
    Ok(Json(serde_json::json!({"tools": tools, "errors": errors})))
}

/// One recorded broker call, as the operator sees it.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct CallView {
    pub seq: u64,
    /// The epoch of the sandbox instance that recorded it.
    pub epoch: u64,
    pub tool: String,
    /// `awaiting_approval`, `pending`, `executing`, `done`, `failed`,
    /// `denied`, `needs_review`.
    pub status: String,
    /// `allow`, `deny` or `require_approval`.
    pub decision: String,
    pub rule_id: Option<String>,
    pub approval_id: Option<String>,
    #[schema(value_type = Object)]
    pub arguments: serde_json::Value,
    /// What the effect was planned to do, recorded before it started (for
    /// `git_push`, with `diff`: the size measured on the host). A push
    /// awaiting approval has `{"diff": …}` here, the size it was decided on.
    #[schema(value_type = Object)]
    pub effect: Option<serde_json::Value>,
    #[schema(value_type = Object)]
    pub output: serde_json::Value,
    pub created_at: String,
    pub updated_at: String,
}

#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct CallList {
    pub calls: Vec<CallView>,
}

/// The tool broker's record of a session's calls, in seq order.
#[utoipa::path(get, path = "/v1/sessions/{id}/broker/calls", tag = "broker",
    params(("id" = String, Path, description = "Session id")),
    responses((status = 200, body = CallList)))]
pub async fn calls(
    State(b): State<Arc<Broker>>,
    Path(id): Path<String>,
) -> Result<Json<CallList>, BrokerError> {
    let calls = b.store().calls(&id).await?;
    let calls = calls.iter().map(view).collect();
    Ok(Json(CallList { calls }))
}

fn view(c: &crate::store::Call) -> CallView {
    let parse = |t: &str| serde_json::from_str::<serde_json::Value>(t).unwrap_or_default();
    CallView {
        seq: c.seq,
        epoch: c.epoch,
        tool: c.tool.clone(),
        status: c.state.as_str().to_string(),
        decision: c.decision.clone(),
        rule_id: c.rule_id.clone(),
        approval_id: c.approval_id.clone(),
        arguments: parse(&c.args),
        effect: c.effect.as_deref().map(parse),
        output: crate::wire::InvokeResult::from_call(c).output,
        created_at: c.created_at.clone(),
        updated_at: c.updated_at.clone(),
    }
}

/// Largest note of a resolution.
pub const MAX_NOTE_BYTES: usize = 4096;

/// How an operator settles a `needs_review` call.
#[derive(serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResolveBody {
    /// `done` (the effect happened) or `failed` (it did not).
    pub outcome: String,
    /// What was checked (up to 4096 bytes).
    #[serde(default)]
    pub note: String,
}

/// Settles a broker call left `needs_review` (the broker could not tell
/// whether its effect happened): recorded with a `broker_call_resolved`
/// event; the agent's retries of that seq get the resolved answer.
/// (A path segment, not `{seq}:resolve`: the router matches whole segments.)
#[utoipa::path(post, path = "/v1/sessions/{id}/tool-calls/{seq}/resolve", tag = "broker",
    params(("id" = String, Path, description = "Session id"),
           ("seq" = u64, Path, description = "The call's seq")),
    request_body = ResolveBody,
    responses((status = 200, body = CallView),
              (status = 400, description = "invalid_request"),
              (status = 404, description = "call_not_found"),
              (status = 409, description = "not_needs_review")))]
pub async fn resolve(
    State(b): State<Arc<Broker>>,
    Path((id, seq)): Path<(String, String)>,
    body: Result<Json<ResolveBody>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<CallView>, BrokerError> {
    let Json(body) = body.map_err(|e| BrokerError::BadRequest(e.body_text()))?;
    let seq: u64 = seq
        .parse()
        .ok()
        .filter(|s| (1..=crate::wire::MAX_SEQ).contains(s))
        .ok_or_else(|| {
            BrokerError::BadRequest(format!("seq must be 1 to {}", crate::wire::MAX_SEQ))
        })?;
    let outcome = match body.outcome.as_str() {
        "done" => crate::store::CallState::Done,
        "failed" => crate::store::CallState::Failed,
        o => {
            return Err(BrokerError::BadRequest(format!(
                "outcome must be done or failed, not {o:?}"
            )))
        }
    };
    if body.note.len() > MAX_NOTE_BYTES {
        return Err(BrokerError::BadRequest(format!(
            "note over {MAX_NOTE_BYTES} bytes"
        )));
    }
    let c = b.resolve_review(&id, seq, outcome, &body.note).await?;
    Ok(Json(view(&c)))
}

/// The operator routes' part of the OpenAPI document, pinned to
/// `docs/openapi-broker.json` by `tests/openapi_snapshot.rs`.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(title = "Hatchery tool broker (operator routes)", version = "1"),
    paths(calls, resolve),
    components(schemas(CallList, CallView, ResolveBody))
)]
pub struct BrokerApi;

pub fn openapi_json() -> String {
    use utoipa::OpenApi;
    BrokerApi::openapi().to_pretty_json().unwrap_or_default()
}

/// Serves the guest router on a Unix socket only root (the daemon) can
/// open; the relay connects there.
pub async fn serve_socket(b: Arc<Broker>, path: std::path::PathBuf) -> std::io::Result<()> {
    serve_on_socket(guest_router(b), path).await
}

/// Serves `app` (the guest router, or a host's relay to the control
/// role's broker) on the `broker` host service's socket, mode 0600.
pub async fn serve_on_socket(app: Router, path: std::path::PathBuf) -> std::io::Result<()> {
    let _ = std::fs::remove_file(&path);
    let l = tokio::net::UnixListener::bind(&path)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    axum::serve(l, app).await
}
