//! The OpenAPI document, generated from the handlers and wire types, and
//! the handler that serves it (`GET /openapi.json`): here rather than
//! among the routes, since the document names the route handlers and
//! they must not import it back. `tests/openapi_snapshot.rs` pins it to
//! `docs/openapi.json`; SDKs are checked against that file.

use crate::code_models::*;
use crate::error::{ErrorBody, ErrorDetail};
use crate::models::*;
use crate::network::*;
use crate::output::OutputEncoding;
use crate::process_models::*;
use crate::routes;
use crate::terminal_models::*;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

#[derive(OpenApi)]
#[openapi(
    info(title = "Hatchery API", version = "1", description = "Disposable, isolated Linux sandboxes."),
    paths(
        routes::sandboxes::create, routes::sandboxes::list, routes::sandboxes::get,
        routes::sandboxes::delete, routes::sandboxes::patch,
        routes::files::write, routes::files::read, routes::files::list, routes::files::remove,
        routes::exec::exec, routes::exec::exec_stream,
        routes::code::run, routes::code::stream, routes::code::create_context, routes::code::list_contexts,
        routes::code::restart_context, routes::code::delete_context,
        routes::processes::list, routes::processes::get, routes::processes::output, routes::processes::stdin,
        routes::processes::close_stdin, routes::processes::signal, routes::processes::wait, routes::processes::kill,
        routes::snapshots::create, routes::snapshots::list, routes::snapshots::get,
        routes::snapshots::delete, routes::snapshots::fork,
        routes::snapshots::put_pool, routes::snapshots::get_pool,
        routes::templates::create, routes::templates::list, routes::templates::get,
        routes::templates::delete, routes::templates::events,
        routes::network::get, routes::network::put, routes::network::events,
        routes::ports::proxy, routes::ports::preview_url, routes::ports::preview,
        routes::pty::attach, routes::pty::token,
        routes::meta::healthz, routes::meta::metrics,
    ),
    components(schemas(CreateSandbox, PatchSandbox, Sandbox, SandboxList, ExecBody, ExecResponse, ExecReason, OutputChunk,
                       CodeBody, CodeResponse, CodeSummary, CodeResultItem, CodeError, CreateContext, CodeContext, CodeContextList,
                       OutputEncoding, ProcessInfo, ProcessList, ProcessChunk, SignalBody,
                       FileEntry, FileList, ErrorBody, ErrorDetail,
                       CreateSnapshot, Snapshot, SnapshotList, ForkBody, SnapshotPoolBody, SnapshotPool,
                       CreateTemplate, TemplateInfo, TemplateState, BuildProgress, TemplateList, BuildAccepted,
                       NetworkPolicy, NetworkRule, EgressMode, EgressEventBody, EgressEventList,
                       routes::ports::CreatePreviewUrl, routes::ports::PreviewUrl,
                       TerminalToken, TerminalClientMessage, TerminalServerMessage)),
    modifiers(&BearerAuth),
    security(("bearer" = []))
)]
pub struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        if let Some(c) = doc.components.as_mut() {
            c.add_security_scheme(
                "bearer",
                SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
            );
            // Terminals only: a token from POST /v1/sandboxes/{id}/pty/token.
            c.add_security_scheme(
                "terminal_token",
                SecurityScheme::ApiKey(ApiKey::Query(ApiKeyValue::with_description(
                    "token",
                    "From POST /v1/sandboxes/{id}/pty/token: one terminal of that sandbox, once, within 60 s",
                ))),
            );
        }
    }
}

/// The daemon's whole document: the sandbox API and the product routers
/// mounted next to it.
pub fn doc() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
        .merge_from(hatchery_policy::openapi::PolicyApiDoc::openapi())
        .merge_from(hatchery_tenants::openapi::TenantApiDoc::openapi())
        .merge_from(hatchery_secrets::openapi::SecretsApiDoc::openapi())
}

/// `GET /openapi.json`: the document as [`doc`] builds it.
pub(crate) async fn serve() -> impl axum::response::IntoResponse {
    axum::Json(doc())
}

pub fn json() -> String {
    doc().to_pretty_json().unwrap_or_default()
}
