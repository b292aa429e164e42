//! HTTP API v1. This crate is the trust boundary for callers: every input is
//! parsed and bounds-checked into a typed request here, and every failure
//! leaves as `{"error":{"code","message"}}` with a fitting status. The
//! OpenAPI document is generated from these types ([`openapi::ApiDoc`]) and
//! snapshot-tested, so it cannot drift from the code.

mod auth;
pub mod code_models;
mod error;
mod extract;
pub mod models;
pub mod network;
pub mod openapi;
pub mod output;
pub mod process_models;
mod routes;
pub mod scope;
pub mod terminal_models;
pub mod terminal_token;

use axum::extract::DefaultBodyLimit;
use axum::routing::{any, delete, get, post};
use axum::Router;
use hatchery_core::Manager;
use std::sync::Arc;

pub use error::ApiError;

#[derive(Clone)]
pub struct AppState {
    pub manager: Arc<Manager>,
    pub api_key: Arc<str>,
    /// Signs and checks preview URLs.
    pub preview: Arc<hatchery_core::PreviewKey>,
    /// Where previews are served (`--preview-url`, or the preview
    /// listener's port on the host name the API was reached at): the
    /// base of the preview URLs handed out.
    pub preview_origin: hatchery_serve::origin::PreviewOrigin,
    /// Mints and checks the tokens browsers attach to terminals with.
    pub terminal_tokens: Arc<terminal_token::TerminalTokens>,
    /// Tenants and their keys: who a bearer key is, and the admission
    /// gate of a tenant's creates.
    pub tenants: Arc<hatchery_tenants::Tenants>,
}

/// JSON bodies are small; file uploads get their own, larger limit.
pub const MAX_JSON_BODY: usize = 2 << 20;

pub fn router(state: AppState) -> Router {
    router_with(state, Router::new())
}

/// [`router`] plus product routers (each with its own state already
/// applied) mounted behind the same API key, e.g. hatchery-policy's
/// `/v1/policies`.
pub fn router_with(state: AppState, products: Router) -> Router {
    let file_limit = state.manager.caps.max_file_bytes as usize + 1;
    let v1 = Router::new()
        .route(
            "/sandboxes",
            post(routes::sandboxes::create).get(routes::sandboxes::list),
        )
        .route(
            "/sandboxes/{id}",
            get(routes::sandboxes::get)
                .delete(routes::sandboxes::delete)
                .patch(routes::sandboxes::patch),
        )
        .route(
            "/sandboxes/{id}/files",
            get(routes::files::read)
                .put(routes::files::write)
                .delete(routes::files::remove)
                .layer(DefaultBodyLimit::max(file_limit)),
        )
        .route("/sandboxes/{id}/files/list", get(routes::files::list))
        .route(
            "/sandboxes/{id}/network",
            get(routes::network::get).put(routes::network::put),
        )
        .route(
            "/sandboxes/{id}/network/events",
            get(routes::network::events),
        )
        .route("/sandboxes/{id}/exec", post(routes::exec::exec))
        .route(
            "/sandboxes/{id}/exec/stream",
            post(routes::exec::exec_stream),
        )
        .route("/sandboxes/{id}/code", post(routes::code::run))
        .route("/sandboxes/{id}/code/stream", post(routes::code::stream))
        .route(
            "/sandboxes/{id}/code/contexts",
            post(routes::code::create_context).get(routes::code::list_contexts),
        )
        .route(
            "/sandboxes/{id}/code/contexts/{context_id}",
            delete(routes::code::delete_context),
        )
        .route(
            "/sandboxes/{id}/code/contexts/{context_id}/restart",
            post(routes::code::restart_context),
        )
        .route("/sandboxes/{id}/processes", get(routes::processes::list))
        .route(
            "/sandboxes/{id}/processes/{pid}",
            get(routes::processes::get).delete(routes::processes::kill),
        )
        .route(
            "/sandboxes/{id}/processes/{pid}/output",
            get(routes::processes::output),
        )
        .route(
            "/sandboxes/{id}/processes/{pid}/stdin",
            post(routes::processes::stdin),
        )
        .route(
            "/sandboxes/{id}/processes/{pid}/stdin/close",
            post(routes::processes::close_stdin),
        )
        .route(
            "/sandboxes/{id}/processes/{pid}/signal",
            post(routes::processes::signal),
        )
        .route(
            "/sandboxes/{id}/processes/{pid}/wait",
            post(routes::processes::wait),
        )
        .route("/sandboxes/{id}/pty/token", post(routes::pty::token))
        .route("/sandboxes/{id}/snapshots", post(routes::snapshots::create))
        .route("/snapshots", get(routes::snapshots::list))
        .route(
            "/snapshots/{id}",
            get(routes::snapshots::get).delete(routes::snapshots::delete),
        )
        .route("/snapshots/{id}/fork", post(routes::snapshots::fork))
        .route(
            "/snapshots/{id}/pool",
            get(routes::snapshots::get_pool).put(routes::snapshots::put_pool),
        )
        .route("/sandboxes/{id}/ports/{port}", any(routes::ports::proxy))
        .route("/sandboxes/{id}/ports/{port}/", any(routes::ports::proxy))
        .route(
            "/sandboxes/{id}/ports/{port}/preview-url",
            post(routes::ports::preview_url).fallback(routes::ports::proxy),
        )
        .route(
            "/sandboxes/{id}/ports/{port}/{*path}",
            any(routes::ports::proxy),
        )
        .route(
            "/templates",
            post(routes::templates::create).get(routes::templates::list),
        )
        .route(
            "/templates/{name}",
            get(routes::templates::get).delete(routes::templates::delete),
        )
        .route(
            "/templates/{name}/builds/{id}/events",
            get(routes::templates::events),
        )
        .layer(DefaultBodyLimit::max(MAX_JSON_BODY));
    let authed = Router::new()
        .nest("/v1", v1)
        .merge(products.with_state::<AppState>(()))
        .route("/metrics", get(routes::meta::metrics))
        .route("/openapi.json", get(openapi::serve))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_key,
        ));
    Router::new()
        .merge(authed)
        // Authenticates itself: the API key, or a terminal token (browsers
        // cannot set headers on a WebSocket).
        .route("/v1/sandboxes/{id}/pty", get(routes::pty::attach))
        // The browser terminal's page and script: static, nothing secret.
        .route("/terminal", get(routes::terminal_page::redirect))
        .route("/terminal/", get(routes::terminal_page::index))
        .route("/terminal/{file}", get(routes::terminal_page::asset))
        .route("/healthz", get(routes::meta::healthz))
        // Previews carry their own grant (a signed token), not the key.
        // On the API's listener the daemon serves them only to another
        // daemon's preview listener forwarding one (hatcheryd's origin
        // guard refuses the rest): guest pages never get this origin.
        .merge(preview_routes())
        .fallback(routes::meta::not_found)
        .method_not_allowed_fallback(routes::meta::method_not_allowed)
        .with_state(state)
}

fn preview_routes() -> Router<AppState> {
    Router::new()
        .route("/preview/{token}", any(routes::ports::preview))
        .route("/preview/{token}/", any(routes::ports::preview))
        .route("/preview/{token}/{*path}", any(routes::ports::preview))
}

/// The preview listener's routes: `/preview/{token}/...` and nothing of
/// the API. Whatever else the listener serves (E2B's relayed ports) is
/// merged in by the daemon.
pub fn preview_router(state: AppState) -> Router {
    preview_routes()
        .fallback(routes::meta::not_found)
        .method_not_allowed_fallback(routes::meta::method_not_allowed)
        .with_state(state)
}
