//! `/v1/secrets`: create, list and delete secrets; a value is accepted and
//! never returned. The operator's key and tenants' keys each work on their
//! own secrets: a tenant's key stores the tenant's, lists and deletes only
//! those (another's name answers 404 `secret_not_found`, as a missing one
//! does). The operator's list shows every owner's, each with its tenant.
//! A policy binds only its owner's secrets (hatchery-policy http.rs), and
//! the egress proxy reads them in the session's tenant. Every failure is
//! `{"error":{"code","message"}}`.

use crate::store::{Listing, Owner, SecretInfo, Secrets, StoreError, MAX_VALUE_BYTES};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::StatusCode;
use axum::routing::{delete, post};
use axum::{Extension, Json, Router};
use hatchery_serve::json_error::HttpError;
use hatchery_tenants::service::Principal;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Names the E2B adapter stores sandboxes' header values under
/// (`e2b.<sandbox>.<n>`, deleted with the sandbox): not for the API, so an
/// operator's secret is never taken for one and swept. (No policy binds
/// one either: hatchery-policy's secret_scope.)
pub const RESERVED_PREFIX: &str = hatchery_policy::secret_scope::ADAPTER_PREFIX;

/// Largest request body: a value at its cap, JSON-escaped, and a name.
pub const MAX_BODY_BYTES: usize = 4 * MAX_VALUE_BYTES + 1024;

impl From<StoreError> for HttpError {
    fn from(e: StoreError) -> Self {
        use StatusCode as S;
        let (status, code) = match &e {
            StoreError::NotFound(_) => (S::NOT_FOUND, "secret_not_found"),
            StoreError::Exists(_) => (S::CONFLICT, "secret_exists"),
            StoreError::Invalid(_) => (S::BAD_REQUEST, "invalid_secret"),
            StoreError::TooMany(_) => (S::CONFLICT, "too_many_secrets"),
            StoreError::Db(d) if d.unavailable() => {
                tracing::warn!(error = %e, "secrets store unavailable");
                return HttpError::new(
                    S::SERVICE_UNAVAILABLE,
                    "store_unavailable",
                    "the secrets store is not reachable; retry shortly",
                );
            }
            StoreError::WrongKey { .. }
            | StoreError::Seal(..)
            | StoreError::Db(_)
            | StoreError::Schema(_) => {
                let request_id = format!("req_{:016x}", rand::random::<u64>());
                tracing::error!(%request_id, error = %hatchery_serve::error_text::with_causes(&e), "secrets store failed");
                return HttpError::new(
                    S::INTERNAL_SERVER_ERROR,
                    "internal",
                    format!("internal error (request id {request_id})"),
                );
            }
        };
        HttpError::new(status, code, e.to_string())
    }
}

/// A new secret. The value is write-only: no route returns it.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSecret {
    /// `[A-Za-z0-9_.-]`, 1–64 characters; policies name it.
    pub name: String,
    /// 1–4096 bytes of printable ASCII.
    pub value: String,
}

#[derive(Serialize, ToSchema)]
pub struct SecretList {
    pub secrets: Vec<SecretInfo>,
}

type Caller = Option<Extension<Principal>>;

/// Whose secrets the caller works on. No principal: a router mounted
/// without the tenants layer (tests) behind the operator's key.
fn owner(caller: &Caller) -> Owner<'_> {
    caller.as_ref().and_then(|Extension(p)| p.tenant())
}

pub fn router(secrets: Secrets) -> Router {
    Router::new()
        .route("/v1/secrets", post(create).get(list))
        .route("/v1/secrets/{name}", delete(remove))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(secrets)
}

/// Store a secret: the caller's (a tenant key's secret is that tenant's,
/// the operator key's the operator's). Its value is sealed with the
/// deployment's key file and is never returned by any route.
#[utoipa::path(post, path = "/v1/secrets", tag = "secrets", request_body = CreateSecret,
    responses((status = 201, body = SecretInfo),
              (status = 400, body = hatchery_serve::json_error::ErrorBody, description = "invalid_secret: name or value out of bounds, or a name reserved for E2B sandboxes (e2b.)"),
              (status = 409, body = hatchery_serve::json_error::ErrorBody, description = "secret_exists (the caller has one of that name), too_many_secrets (the caller's cap)"),
              (status = 413, body = hatchery_serve::json_error::ErrorBody)))]
pub async fn create(
    State(s): State<Secrets>,
    caller: Caller,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<SecretInfo>), HttpError> {
    let body = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            HttpError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!("request body over {MAX_BODY_BYTES} bytes"),
            )
        } else {
            HttpError::new(StatusCode::BAD_REQUEST, "invalid_request", e.body_text())
        }
    })?;
    // serde_json's error names a position, never the value it read.
    let req: CreateSecret = serde_json::from_slice(&body).map_err(|e| {
        HttpError::new(
            StatusCode::BAD_REQUEST,
            "invalid_secret",
            format!("body: {e}"),
        )
    })?;
    if req.name.starts_with(RESERVED_PREFIX) {
        return Err(HttpError::new(
            StatusCode::BAD_REQUEST,
            "invalid_secret",
            format!("names starting with {RESERVED_PREFIX:?} are reserved for the header values of E2B sandboxes (docs/e2b.md)"),
        ));
    }
    let info = s.create(owner(&caller), &req.name, &req.value).await?;
    tracing::info!(secret = %info.name, tenant = ?info.tenant, bytes = info.bytes, "secret stored");
    Ok((StatusCode::CREATED, Json(info)))
}

/// Name, owner, length and creation time (never a value) of the caller's
/// secrets; with the operator key, of every owner's.
#[utoipa::path(get, path = "/v1/secrets", tag = "secrets",
    responses((status = 200, body = SecretList)))]
pub async fn list(State(s): State<Secrets>, caller: Caller) -> Result<Json<SecretList>, HttpError> {
    let which = match owner(&caller) {
        None => Listing::All,
        tenant => Listing::Of(tenant),
    };
    Ok(Json(SecretList {
        secrets: s.list(which).await?,
    }))
}

/// Delete one of the caller's secrets (the operator key: the operator's
/// own). A policy that names it stays; the proxy then refuses the
/// requests it would have added it to (503, with an event).
#[utoipa::path(delete, path = "/v1/secrets/{name}", tag = "secrets", params(("name" = String, Path)),
    responses((status = 204),
              (status = 404, body = hatchery_serve::json_error::ErrorBody, description = "secret_not_found: the caller has no secret of that name (another owner's is not there for it)")))]
pub async fn remove(
    State(s): State<Secrets>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<StatusCode, HttpError> {
    let who = owner(&caller);
    s.delete(who, &name).await?;
    tracing::info!(secret = %name, tenant = ?who, "secret deleted");
    Ok(StatusCode::NO_CONTENT)
}
