//! `/v1/policies`: create, version, list and read policies. Every failure
//! is `{"error":{"code","message"}}`; a validation error's message names the
//! rule by index and id. The daemon mounts this behind its API key, whose
//! check puts the caller's [`Principal`] in the request: a tenant's key
//! makes policies of its own and reaches only those and the built-in ones
//! (another's answers 404 `policy_not_found`, as a missing one does); no
//! principal (tests, a bare mount) is the operator.

use crate::document::PolicyDocument;
use crate::store::{reachable, PolicyStore, PolicySummary, StoreError, StoredPolicy};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Extension, Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use hatchery_tenants::Principal;
use serde::Serialize;
use std::sync::Arc;
use utoipa::ToSchema;

/// Largest policy document accepted, in bytes (the JSON body).
pub const MAX_DOCUMENT_BYTES: usize = 1 << 20;

pub use hatchery_serve::json_error::{ErrorBody, ErrorDetail, HttpError};

impl From<StoreError> for HttpError {
    fn from(e: StoreError) -> Self {
        use StatusCode as S;
        let (status, code) = match &e {
            StoreError::NotFound(_) => (S::NOT_FOUND, "policy_not_found"),
            StoreError::VersionNotFound(..) => (S::NOT_FOUND, "policy_version_not_found"),
            StoreError::Invalid(_) => (S::BAD_REQUEST, "invalid_policy"),
            StoreError::ReadOnly(_) => (S::CONFLICT, "policy_read_only"),
            StoreError::TooMany(..) | StoreError::TooManyVersions(..) => {
                (S::CONFLICT, "too_many_policies")
            }
            StoreError::Unavailable(_) => {
                tracing::warn!(error = %e, "policy store unavailable");
                return HttpError::new(
                    S::SERVICE_UNAVAILABLE,
                    "store_unavailable",
                    "the policy store is not reachable; retry shortly",
                );
            }
            // OutOfScope is the compiled cache's (cache.rs), never these
            // routes': one here is a bug, reported as such.
            StoreError::Db(_)
            | StoreError::OutOfScope { .. }
            | StoreError::Schema(_)
            | StoreError::Corrupt(_)
            | StoreError::Raced(_) => {
                // The cause stays in the log; the caller gets an id to quote.
                let request_id = format!("req_{:016x}", rand::random::<u64>());
                tracing::error!(%request_id, error = %e, "policy store failed");
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

/// Which secret names `owner` (a tenant; `None`: the operator) has not
/// stored: a policy whose credential rules name one is refused (400
/// `unknown_secret`) before it is stored. The daemon passes its secrets
/// store (hatchery-secrets).
#[async_trait::async_trait]
pub trait SecretNames: Send + Sync + 'static {
    async fn missing(
        &self,
        owner: Option<String>,
        names: Vec<String>,
    ) -> Result<Vec<String>, Box<dyn std::error::Error + Send + Sync>>;
}

/// The request's caller as a tenant id (`None`: the operator).
type Caller = Option<Extension<Principal>>;

fn tenant_of(who: &Caller) -> Option<&str> {
    who.as_ref().and_then(|Extension(p)| p.tenant())
}

/// `p` if the caller reaches it, else 404 as for a missing policy.
fn visible(p: StoredPolicy, who: &Caller) -> Result<StoredPolicy, HttpError> {
    if reachable(p.builtin, p.tenant.as_deref(), tenant_of(who)) {
        Ok(p)
    } else {
        Err(StoreError::NotFound(p.id).into())
    }
}

/// The routes' state: the store and the secrets check.
#[derive(Clone)]
pub struct Api {
    store: Arc<dyn PolicyStore>,
    secrets: Option<Arc<dyn SecretNames>>,
}

/// Without a secrets check: a policy with a credential rule is refused
/// (there is no secret it could name).
pub fn router(store: Arc<dyn PolicyStore>) -> Router {
    router_with_secrets(store, None)
}

pub fn router_with_secrets(
    store: Arc<dyn PolicyStore>,
    secrets: Option<Arc<dyn SecretNames>>,
) -> Router {
    Router::new()
        .route("/v1/policies", post(create).get(list))
        .route("/v1/policies/{id}", get(latest))
        .route("/v1/policies/{id}/versions", post(add_version))
        .route("/v1/policies/{id}/versions/{version}", get(version))
        .layer(DefaultBodyLimit::max(MAX_DOCUMENT_BYTES))
        .with_state(Api { store, secrets })
}

/// No document binds an E2B sandbox's own secret (secret_scope.rs, 400
/// `reserved_secret_name`).
fn check_scope(doc: &PolicyDocument) -> Result<(), HttpError> {
    use crate::secret_scope::ScopeError;
    crate::secret_scope::check(doc).map_err(|e| {
        let (status, code) = match &e {
            ScopeError::AdapterSecret { .. } => (StatusCode::BAD_REQUEST, "reserved_secret_name"),
        };
        HttpError::new(status, code, e.to_string())
    })
}

/// Every secret the document's credential rules name must be one `owner`
/// (the policy's: a tenant, or `None` for the operator) has stored. A
/// tenant's policy naming the operator's or another tenant's secret is
/// refused as for a name nobody stored (400 `unknown_secret`), so the
/// answer tells a tenant nothing of others' names; at use, the proxy
/// reads names in the session's tenant whatever a document says.
async fn check_secrets(
    api: &Api,
    doc: &PolicyDocument,
    owner: Option<&str>,
) -> Result<(), HttpError> {
    let mut names: Vec<String> = doc
        .rules
        .iter()
        .filter_map(|r| r.credential.as_ref().map(|c| c.secret.clone()))
        .collect();
    if names.is_empty() {
        return Ok(());
    }
    names.sort();
    names.dedup();
    let missing = match &api.secrets {
        None => names,
        Some(s) => s.missing(owner.map(str::to_string), names).await.map_err(|e| {
            let request_id = format!("req_{:016x}", rand::random::<u64>());
            tracing::error!(%request_id, error = %hatchery_serve::error_text::with_causes(&*e), "secret names not checked");
            HttpError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_unavailable",
                format!("the secrets store did not answer (request id {request_id}); retry shortly"),
            )
        })?,
    };
    if missing.is_empty() {
        Ok(())
    } else {
        Err(HttpError::new(
            StatusCode::BAD_REQUEST,
            "unknown_secret",
            format!(
                "credential rules name secrets that are not among {}: {}",
                match owner {
                    Some(t) => format!("tenant {t}'s secrets (a policy binds only its owner's)"),
                    None => "the operator's secrets".to_string(),
                },
                missing.join(", ")
            ),
        ))
    }
}

fn parse_doc(body: Result<Bytes, BytesRejection>) -> Result<PolicyDocument, HttpError> {
    let body = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            HttpError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!("policy document over {MAX_DOCUMENT_BYTES} bytes"),
            )
        } else {
            HttpError::new(StatusCode::BAD_REQUEST, "invalid_request", e.body_text())
        }
    })?;
    serde_json::from_slice(&body).map_err(|e| {
        HttpError::new(
            StatusCode::BAD_REQUEST,
            "invalid_policy",
            format!("policy document: {e}"),
        )
    })
}

fn check_id(id: &str) -> Result<(), HttpError> {
    let ok = id.len() <= 64
        && id.starts_with("pol_")
        && id[4..]
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(HttpError::new(
            StatusCode::NOT_FOUND,
            "policy_not_found",
            format!("policy {id:?} not found"),
        ))
    }
}

#[derive(Serialize, ToSchema)]
pub struct PolicyList {
    pub policies: Vec<PolicySummary>,
}

/// Create a policy; it starts at version 1.
#[utoipa::path(post, path = "/v1/policies", tag = "policies", request_body = PolicyDocument,
    responses((status = 201, body = StoredPolicy),
              (status = 400, body = ErrorBody, description = "invalid_policy: the message names the rule (index and id); unknown_secret: a credential rule names a secret the caller has not stored (a tenant's policy binds only the tenant's own); reserved_secret_name: a credential rule names an `e2b.` secret"),
              (status = 413, body = ErrorBody)))]
pub async fn create(
    State(api): State<Api>,
    who: Caller,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<StoredPolicy>), HttpError> {
    let doc = parse_doc(body)?;
    crate::compile::Policy::compile(&doc).map_err(StoreError::from)?;
    check_scope(&doc)?;
    check_secrets(&api, &doc, tenant_of(&who)).await?;
    let p = api.store.create(doc, tenant_of(&who)).await?;
    tracing::info!(policy = %p.id, version = p.version, rules = p.document.rules.len(), "policy created");
    Ok((StatusCode::CREATED, Json(p)))
}

/// Add the next version of a policy. Earlier versions stay as they were:
/// sessions pinned to them keep their rules.
#[utoipa::path(post, path = "/v1/policies/{id}/versions", tag = "policies", request_body = PolicyDocument,
    params(("id" = String, Path)),
    responses((status = 201, body = StoredPolicy),
              (status = 400, body = ErrorBody, description = "as for a create; a credential rule's secret must be the policy's owner's"),
              (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody, description = "policy_read_only: pol_standard")))]
pub async fn add_version(
    State(api): State<Api>,
    who: Caller,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<StoredPolicy>), HttpError> {
    check_id(&id)?;
    // Another tenant's policy is not there for this caller. (Between this
    // read and the write its owner cannot change: a policy's tenant is
    // set once, at create.)
    let head = visible(api.store.latest(&id).await?, &who)?;
    let doc = parse_doc(body)?;
    crate::compile::Policy::compile(&doc).map_err(StoreError::from)?;
    // The policy's owner's secrets, even in a version the operator writes
    // (the tenant's sessions use it, and read its secrets in the tenant).
    // The caller's, for a tenant writing to a built-in policy: refused as
    // read-only only by the store, after this check, which then names
    // only the caller's own.
    check_scope(&doc)?;
    check_secrets(&api, &doc, head.tenant.as_deref().or(tenant_of(&who))).await?;
    let p = api.store.add_version(&id, doc).await?;
    tracing::info!(policy = %p.id, version = p.version, rules = p.document.rules.len(), "policy version added");
    Ok((StatusCode::CREATED, Json(p)))
}

/// Every policy with its latest version number.
#[utoipa::path(get, path = "/v1/policies", tag = "policies", responses((status = 200, body = PolicyList)))]
pub async fn list(State(api): State<Api>, who: Caller) -> Result<Json<PolicyList>, HttpError> {
    let caller = tenant_of(&who);
    let mut policies = api.store.list().await?;
    policies.retain(|p| reachable(p.builtin, p.tenant.as_deref(), caller));
    Ok(Json(PolicyList { policies }))
}

/// The latest version of a policy.
#[utoipa::path(get, path = "/v1/policies/{id}", tag = "policies", params(("id" = String, Path)),
    responses((status = 200, body = StoredPolicy), (status = 404, body = ErrorBody)))]
pub async fn latest(
    State(api): State<Api>,
    who: Caller,
    Path(id): Path<String>,
) -> Result<Json<StoredPolicy>, HttpError> {
    check_id(&id)?;
    Ok(Json(visible(api.store.latest(&id).await?, &who)?))
}

/// One version of a policy, as it was written.
#[utoipa::path(get, path = "/v1/policies/{id}/versions/{version}", tag = "policies",
    params(("id" = String, Path), ("version" = u32, Path)),
    responses((status = 200, body = StoredPolicy), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn version(
    State(api): State<Api>,
    who: Caller,
    Path((id, version)): Path<(String, String)>,
) -> Result<Json<StoredPolicy>, HttpError> {
    check_id(&id)?;
    let v: u32 = version.parse().ok().filter(|v| *v >= 1).ok_or_else(|| {
        HttpError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            format!("version {version:?} is not a positive integer"),
        )
    })?;
    // Checked on the policy's head first, so another tenant's policy
    // answers policy_not_found whatever version is asked.
    visible(api.store.latest(&id).await?, &who)?;
    Ok(Json(api.store.version(&id, v).await?))
}
