//! `/v1/tenants`: tenants and their keys, for the operator only. The
//! daemon mounts this behind its API auth, which puts the caller's
//! [`Principal`] in the request's extensions; a tenant key gets 403
//! `forbidden`, and a request with no principal at all is refused the
//! same way (mounted without the auth, it serves nobody). Every failure is
//! `{"error":{"code","message"}}`; bodies are parsed into typed, validated
//! requests before the store sees them.

use crate::model::{CreatedKey, NewTenant, Tenant, TenantKey, TenantPatch};
use crate::service::{DeleteError, Principal, Tenants};
use crate::store::StoreError;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::StatusCode;
use axum::routing::{delete, get, post};
use axum::{Extension, Json, Router};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::sync::Arc;
use utoipa::ToSchema;

/// Largest request body, in bytes.
pub const MAX_BODY_BYTES: usize = 16 << 10;

pub use hatchery_serve::json_error::{ErrorBody, ErrorDetail, HttpError};

fn forbidden() -> HttpError {
    HttpError::new(
        StatusCode::FORBIDDEN,
        "forbidden",
        "tenants are managed with the operator key only",
    )
}

fn internal(e: &(dyn std::error::Error + 'static)) -> HttpError {
    let request_id = format!("req_{:016x}", rand::random::<u64>());
    let causes = hatchery_serve::error_text::with_causes(e);
    tracing::error!(%request_id, error = %causes, "tenants failed");
    HttpError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        format!("internal error (request id {request_id})"),
    )
}

impl From<StoreError> for HttpError {
    fn from(e: StoreError) -> Self {
        use StatusCode as S;
        let (status, code) = match &e {
            StoreError::NotFound(_) => (S::NOT_FOUND, "tenant_not_found"),
            StoreError::KeyNotFound { .. } => (S::NOT_FOUND, "key_not_found"),
            StoreError::Invalid(_) => (S::BAD_REQUEST, "invalid_request"),
            StoreError::TooManyTenants(_) => (S::CONFLICT, "too_many_tenants"),
            StoreError::TooManyKeys(..) => (S::CONFLICT, "too_many_keys"),
            StoreError::Unavailable(_) => {
                tracing::warn!(error = %e, "tenant store unavailable");
                return HttpError::new(
                    S::SERVICE_UNAVAILABLE,
                    "store_unavailable",
                    "the tenant store is not reachable; retry shortly",
                );
            }
            StoreError::Db(_) | StoreError::Schema(_) => return internal(&e),
        };
        HttpError::new(status, code, e.to_string())
    }
}

impl From<DeleteError> for HttpError {
    fn from(e: DeleteError) -> Self {
        match e {
            DeleteError::InUse { .. } => {
                HttpError::new(StatusCode::CONFLICT, "tenant_in_use", e.to_string())
            }
            DeleteError::Store(s) => s.into(),
            DeleteError::Usage(u) => internal(&u),
        }
    }
}

type St = Arc<Tenants>;
type Caller = Option<Extension<Principal>>;

fn operator(caller: &Caller) -> Result<(), HttpError> {
    match caller {
        Some(Extension(Principal::Operator)) => Ok(()),
        _ => Err(forbidden()),
    }
}

pub fn router(tenants: St) -> Router {
    Router::new()
        .route("/v1/tenants", post(create).get(list))
        .route("/v1/tenants/{id}", get(read).patch(update).delete(remove))
        .route("/v1/tenants/{id}/keys", post(create_key).get(list_keys))
        .route("/v1/tenants/{id}/keys/{key_id}", delete(revoke_key))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(tenants)
}

fn parse<T: DeserializeOwned>(body: Result<Bytes, BytesRejection>) -> Result<T, HttpError> {
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
    serde_json::from_slice(&body)
        .map_err(|e| HttpError::new(StatusCode::BAD_REQUEST, "invalid_request", e.to_string()))
}

/// Ids this crate makes: `ten_`/`key_` and 16 lowercase hex digits. Any
/// other is not found, before the store is asked.
fn check_id(id: &str, prefix: &str, code: &'static str) -> Result<(), HttpError> {
    let ok = id.len() == prefix.len() + 16
        && id.starts_with(prefix)
        && id[prefix.len()..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if ok {
        Ok(())
    } else {
        Err(HttpError::new(
            StatusCode::NOT_FOUND,
            code,
            format!("{id:?} not found"),
        ))
    }
}

#[derive(Serialize, ToSchema)]
pub struct TenantList {
    pub tenants: Vec<Tenant>,
}

#[derive(Serialize, ToSchema)]
pub struct KeyList {
    pub keys: Vec<TenantKey>,
}

/// Create a tenant. Limits are optional; each absent one is unlimited.
#[utoipa::path(post, path = "/v1/tenants", tag = "tenants", request_body = NewTenant,
    responses((status = 201, body = Tenant),
              (status = 400, body = ErrorBody, description = "invalid_request: name or a limit out of range"),
              (status = 403, body = ErrorBody, description = "forbidden: a tenant key"),
              (status = 409, body = ErrorBody, description = "too_many_tenants")))]
pub async fn create(
    State(t): State<St>,
    caller: Caller,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<Tenant>), HttpError> {
    operator(&caller)?;
    let req: NewTenant = parse(body)?;
    req.validate().map_err(StoreError::from)?;
    let tenant = t.store.create(req).await?;
    tracing::info!(tenant = %tenant.id, name = %tenant.name, "tenant created");
    Ok((StatusCode::CREATED, Json(tenant)))
}

/// Every tenant.
#[utoipa::path(get, path = "/v1/tenants", tag = "tenants",
    responses((status = 200, body = TenantList), (status = 403, body = ErrorBody)))]
pub async fn list(State(t): State<St>, caller: Caller) -> Result<Json<TenantList>, HttpError> {
    operator(&caller)?;
    Ok(Json(TenantList {
        tenants: t.store.list().await?,
    }))
}

#[utoipa::path(get, path = "/v1/tenants/{id}", tag = "tenants", params(("id" = String, Path)),
    responses((status = 200, body = Tenant), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn read(
    State(t): State<St>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Tenant>, HttpError> {
    operator(&caller)?;
    check_id(&id, "ten_", "tenant_not_found")?;
    Ok(Json(t.store.get(&id).await?))
}

/// Change a tenant's name or limits; `limits`, when given, replaces all
/// five (an absent one becomes unlimited). A lower limit refuses new
/// creates; it does not stop what runs.
#[utoipa::path(patch, path = "/v1/tenants/{id}", tag = "tenants", params(("id" = String, Path)),
    request_body = TenantPatch,
    responses((status = 200, body = Tenant), (status = 400, body = ErrorBody),
              (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn update(
    State(t): State<St>,
    caller: Caller,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Tenant>, HttpError> {
    operator(&caller)?;
    check_id(&id, "ten_", "tenant_not_found")?;
    let patch: TenantPatch = parse(body)?;
    patch.validate().map_err(StoreError::from)?;
    let tenant = t.store.update(&id, patch).await?;
    tracing::info!(tenant = %tenant.id, "tenant updated");
    Ok(Json(tenant))
}

/// Delete a tenant and all its keys. Refused (409 `tenant_in_use`) while
/// it has live sandboxes or sessions.
#[utoipa::path(delete, path = "/v1/tenants/{id}", tag = "tenants", params(("id" = String, Path)),
    responses((status = 204), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody, description = "tenant_in_use")))]
pub async fn remove(
    State(t): State<St>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<StatusCode, HttpError> {
    operator(&caller)?;
    check_id(&id, "ten_", "tenant_not_found")?;
    t.delete(&id).await?;
    tracing::info!(tenant = %id, "tenant deleted");
    Ok(StatusCode::NO_CONTENT)
}

/// Make an API key for the tenant. The answer is the only time the key is
/// shown: only its hash is stored.
#[utoipa::path(post, path = "/v1/tenants/{id}/keys", tag = "tenants", params(("id" = String, Path)),
    responses((status = 201, body = CreatedKey), (status = 403, body = ErrorBody),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody, description = "too_many_keys")))]
pub async fn create_key(
    State(t): State<St>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<CreatedKey>), HttpError> {
    operator(&caller)?;
    check_id(&id, "ten_", "tenant_not_found")?;
    let k = t.create_key(&id).await?;
    tracing::info!(tenant = %id, key = %k.info.id, prefix = %k.info.prefix, "tenant key created");
    Ok((StatusCode::CREATED, Json(k)))
}

/// The tenant's keys, revoked ones included; never a secret.
#[utoipa::path(get, path = "/v1/tenants/{id}/keys", tag = "tenants", params(("id" = String, Path)),
    responses((status = 200, body = KeyList), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn list_keys(
    State(t): State<St>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<KeyList>, HttpError> {
    operator(&caller)?;
    check_id(&id, "ten_", "tenant_not_found")?;
    Ok(Json(KeyList {
        keys: t.store.list_keys(&id).await?,
    }))
}

/// Revoke a key; it is refused from the next request on.
#[utoipa::path(delete, path = "/v1/tenants/{id}/keys/{key_id}", tag = "tenants",
    params(("id" = String, Path), ("key_id" = String, Path)),
    responses((status = 200, body = TenantKey), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn revoke_key(
    State(t): State<St>,
    caller: Caller,
    Path((id, key_id)): Path<(String, String)>,
) -> Result<Json<TenantKey>, HttpError> {
    operator(&caller)?;
    check_id(&id, "ten_", "tenant_not_found")?;
    check_id(&key_id, "key_", "key_not_found")?;
    let k = t.revoke_key(&id, &key_id).await?;
    tracing::info!(tenant = %id, key = %k.id, "tenant key revoked");
    Ok(Json(k))
}
