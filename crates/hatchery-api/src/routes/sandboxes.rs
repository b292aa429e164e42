use crate::error::ErrorBody;
use crate::extract::Json;
use crate::models::{
    validate_env, validate_metadata, validate_ttl, CreateSandbox, PatchSandbox, Sandbox,
    SandboxList,
};
use crate::{scope, ApiError, AppState};
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::Extension;
use hatchery_core::CreateRequest;
use hatchery_templates::DEFAULT_TEMPLATE;
use hatchery_tenants::Principal;
use std::collections::BTreeMap;

#[utoipa::path(post, path = "/v1/sandboxes", request_body = CreateSandbox, tag = "sandboxes",
    responses((status = 201, body = Sandbox), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 429, body = ErrorBody, description = "tenant_limit: the tenant's live_sandboxes limit is reached"),
              (status = 503, body = ErrorBody)))]
pub async fn create(
    State(st): State<AppState>,
    principal: Option<Extension<Principal>>,
    Json(mut body): Json<CreateSandbox>,
) -> Result<(StatusCode, axum::Json<Sandbox>), ApiError> {
    let caps = &st.manager.caps;
    let ttl = validate_ttl(body.ttl_seconds, caps)?;
    let principal = principal.as_ref().map(|e| &e.0);
    scope::stamp(principal, &mut body.metadata);
    validate_metadata(&body.metadata, caps)?;
    validate_env(&body.env, caps)?;
    let req = CreateRequest {
        template: body
            .template
            .unwrap_or_else(|| DEFAULT_TEMPLATE.to_string()),
        ttl_seconds: Some(ttl),
        metadata: body.metadata,
        env: body.env,
        network: body.network.map(Into::into),
    };
    // Held until the sandbox exists (or failed): it counts as the
    // tenant's meanwhile.
    let _admitted = scope::admit(&st, principal, 1).await?;
    let info = st.manager.create(req).await?;
    Ok((StatusCode::CREATED, axum::Json(info.into())))
}

/// `?metadata.KEY=VALUE`, repeatable; all must match.
#[utoipa::path(get, path = "/v1/sandboxes", tag = "sandboxes",
    params(("metadata.KEY" = Option<String>, Query, description = "filter on a metadata entry; repeatable")),
    responses((status = 200, body = SandboxList), (status = 400, body = ErrorBody)))]
pub async fn list(
    State(st): State<AppState>,
    principal: Option<Extension<Principal>>,
    RawQuery(q): RawQuery,
) -> Result<axum::Json<SandboxList>, ApiError> {
    let mut filter = metadata_filter(q)?;
    scope::stamp(principal.as_ref().map(|e| &e.0), &mut filter);
    let sandboxes = st
        .manager
        .list(&filter)
        .await?
        .into_iter()
        .map(Into::into)
        .collect();
    Ok(axum::Json(SandboxList { sandboxes }))
}

/// `metadata.KEY=VALUE` pairs of a query string; anything else is a 400.
pub fn metadata_filter(q: Option<String>) -> Result<BTreeMap<String, String>, ApiError> {
    let mut filter = BTreeMap::new();
    if let Some(q) = q {
        let pairs: Vec<(String, String)> = serde_urlencoded_pairs(&q)
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", e))?;
        for (k, v) in pairs {
            match k.strip_prefix("metadata.") {
                Some(key) if !key.is_empty() => {
                    filter.insert(key.to_string(), v);
                }
                _ => {
                    return Err(ApiError::new(
                        StatusCode::BAD_REQUEST,
                        "invalid_query",
                        format!("unknown parameter {k}"),
                    ))
                }
            }
        }
    }
    Ok(filter)
}

fn serde_urlencoded_pairs(q: &str) -> Result<Vec<(String, String)>, String> {
    axum::extract::Query::<Vec<(String, String)>>::try_from_uri(
        &format!("/?{q}")
            .parse()
            .map_err(|e: axum::http::uri::InvalidUri| e.to_string())?,
    )
    .map(|q| q.0)
    .map_err(|e| e.body_text())
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}", tag = "sandboxes", params(("id" = String, Path)),
    responses((status = 200, body = Sandbox), (status = 404, body = ErrorBody)))]
pub async fn get(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<axum::Json<Sandbox>, ApiError> {
    Ok(axum::Json(st.manager.get(&id).await?.into()))
}

/// Idempotent: 204 whether or not the sandbox still exists. Teardown
/// happens in the background and completes within seconds.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}", tag = "sandboxes", params(("id" = String, Path)),
    responses((status = 204)))]
pub async fn delete(State(st): State<AppState>, Path(id): Path<String>) -> StatusCode {
    st.manager.delete(&id).await;
    StatusCode::NO_CONTENT
}

#[utoipa::path(patch, path = "/v1/sandboxes/{id}", tag = "sandboxes", params(("id" = String, Path)),
    request_body = PatchSandbox,
    responses((status = 200, body = Sandbox), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn patch(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Json(body): Json<PatchSandbox>,
) -> Result<axum::Json<Sandbox>, ApiError> {
    let ttl = validate_ttl(Some(body.ttl_seconds), &st.manager.caps)?;
    Ok(axum::Json(st.manager.set_ttl(&id, ttl).await?.into()))
}
