//! E2B compatibility: the official E2B SDKs (`e2b`, `e2b-code-interpreter`
//! on PyPI, `e2b` on npm) drive Hatchery unchanged with
//!
//! ```text
//! E2B_API_URL=http://127.0.0.1:7423/e2b
//! E2B_SANDBOX_URL=http://127.0.0.1:7423/e2b/sandbox
//! E2B_API_KEY=$(cat /var/lib/hatchery/api_key)   # or a tenant's htk_ key
//! ```
//!
//! [`control`] is the control plane, [`sandbox`] routes sandbox traffic by
//! the `E2b-Sandbox-Id`/`-Port` headers to envd ([`process`], [`fs`],
//! [`files`]) or the code interpreter ([`interpreter`]). Sandboxes are
//! reached only through the [`backend::Backend`] trait. docs/e2b.md lists
//! what is supported.
//!
//! Layering (no module needs one that needs it back): [`backend`] and
//! [`lifecycle`] at the bottom, [`state`] over them; what several handlers
//! share is in small modules of its own ([`api_error`], [`query`],
//! [`template_alias`], [`pause_resume`], [`process_frames`], [`pty_tap`]);
//! the handlers and the [`auto_pause`] sweep on top. [`tenancy`] decides
//! who a key is (the operator, or one tenant) and what a tenant reaches.

pub mod api_error;
pub mod auto_pause;
pub mod backend;
pub mod connect;
pub mod control;
pub mod file_metadata;
pub mod files;
pub mod fs;
pub mod header_rules;
mod host_name;
pub mod interpreter;
pub mod lifecycle;
pub mod network;
pub mod pause_resume;
pub mod pb;
pub mod process;
pub mod process_frames;
pub mod pty_tap;
pub mod query;
pub mod sandbox;
pub mod sever;
pub mod snapshots;
pub mod state;
pub mod template_alias;
pub mod tenancy;
pub mod user;

use axum::extract::DefaultBodyLimit;
use axum::extract::State;
use axum::routing::{any, delete, get, post};
use axum::Router;
use std::sync::Arc;

pub use backend::Backend;

/// Where the control plane is mounted.
pub const API_PREFIX: &str = "/e2b";
/// Where sandbox traffic (`E2B_SANDBOX_URL`) is mounted.
pub const SANDBOX_PREFIX: &str = "/e2b/sandbox";
/// Control-plane JSON bodies.
pub const MAX_JSON_BODY: usize = 1 << 20;

/// The E2B routes, to merge into the daemon's router. Uploads are bounded
/// by `max_file_bytes` (plus multipart overhead).
pub fn router(backend: Arc<dyn Backend>, max_file_bytes: u64) -> Router {
    let shared = state::Shared::new(backend);
    tokio::spawn(auto_pause::sweep(Arc::downgrade(&shared)));
    let control = Router::new()
        .route("/sandboxes", post(control::create_v1).get(control::list_v1))
        .route(
            "/v2/sandboxes",
            post(control::create_v2).get(control::list_v2),
        )
        .route("/sandboxes/{id}", get(control::get).delete(control::kill))
        .route("/sandboxes/{id}/timeout", post(control::set_timeout))
        .route("/sandboxes/{id}/refreshes", post(control::refresh))
        .route("/sandboxes/{id}/connect", post(control::connect_v1))
        .route("/v2/sandboxes/{id}/connect", post(control::connect_v2))
        .route("/sandboxes/{id}/pause", post(control::pause))
        .route("/sandboxes/{id}/resume", post(control::resume))
        .route("/sandboxes/{id}/fork", post(control::fork))
        .route("/sandboxes/{id}/metrics", get(control::metrics))
        .route("/sandboxes/{id}/snapshots", post(snapshots::create))
        .route("/snapshots", get(snapshots::list))
        .route("/templates/{id}", delete(snapshots::delete))
        .route(
            "/templates/aliases/{alias}",
            get(control::template_alias_get),
        )
        .route(
            "/sandboxes/{id}/network",
            axum::routing::put(control::set_network),
        )
        .layer(DefaultBodyLimit::max(MAX_JSON_BODY))
        .route_layer(axum::middleware::from_fn_with_state(
            Arc::clone(&shared),
            control::require_key,
        ));
    let upload_limit = (max_file_bytes + files::MULTIPART_OVERHEAD) as usize;
    // Paths here are without SANDBOX_PREFIX; `sandbox::dispatch` strips
    // it, authenticates and routes by port before these see a request.
    let envd = Router::new()
        .route("/process.Process/{method}", post(process::rpc))
        .route("/filesystem.Filesystem/{method}", post(fs::rpc))
        .route(
            "/files",
            get(files::download)
                .post(files::upload)
                .layer(DefaultBodyLimit::max(upload_limit)),
        )
        .route("/health", get(files::health))
        .route("/execute", post(interpreter::execute))
        .route(
            "/contexts",
            post(interpreter::create_context).get(interpreter::list_contexts),
        )
        .route("/contexts/{id}", delete(interpreter::delete_context))
        .route("/contexts/{id}/restart", post(interpreter::restart_context))
        .layer(DefaultBodyLimit::max(connect::MAX_MESSAGE_BYTES + 5))
        .layer(axum::Extension(files::UploadCap(max_file_bytes)))
        .fallback(sandbox_fallback)
        .method_not_allowed_fallback(sandbox_fallback)
        .with_state(Arc::clone(&shared));
    let entry = {
        let envd = envd.clone();
        move |State(s): State<Arc<state::Shared>>, req: axum::extract::Request| {
            sandbox::dispatch(s, envd.clone(), req)
        }
    };
    // Signed file URLs: the SDKs join `/files` to `E2B_SANDBOX_URL`,
    // which drops its path, so they arrive at the root with no sandbox id;
    // the signature names the sandbox (files::signer).
    let signed = Router::new()
        .route(
            "/files",
            get(files::signed_download).post(files::signed_upload),
        )
        .layer(DefaultBodyLimit::max(upload_limit))
        .layer(axum::Extension(files::UploadCap(max_file_bytes)))
        .with_state(Arc::clone(&shared));
    Router::new()
        .merge(signed)
        .nest(API_PREFIX, control.fallback(control::not_found))
        .route(SANDBOX_PREFIX, any(entry.clone()))
        .route(&format!("{SANDBOX_PREFIX}/"), any(entry.clone()))
        .route(&format!("{SANDBOX_PREFIX}/{{*rest}}"), any(entry))
        .with_state(shared)
}

async fn sandbox_fallback() -> axum::response::Response {
    sandbox::plain_error(axum::http::StatusCode::NOT_FOUND, "no such route")
}

/// A request body, bounded; an oversized one is `resource_exhausted`.
pub(crate) async fn read_body(
    req: axum::extract::Request,
    max: usize,
) -> Result<axum::body::Bytes, connect::ConnectError> {
    axum::body::to_bytes(req.into_body(), max)
        .await
        .map_err(|_| {
            connect::ConnectError::new(
                connect::Code::ResourceExhausted,
                format!("request over {max} bytes, or its body failed"),
            )
        })
}

/// A sandbox request's path (and query) without [`SANDBOX_PREFIX`].
pub(crate) fn strip_prefix(path: &str) -> String {
    match path.strip_prefix(SANDBOX_PREFIX) {
        Some(rest) if rest.starts_with('/') => rest.to_string(),
        Some(rest) => format!("/{rest}"),
        None => path.to_string(),
    }
}

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
