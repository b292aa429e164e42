use crate::error::ErrorBody;
use crate::extract::Json;
use crate::models::{
    bounded, validate_metadata, validate_ttl, CreateSnapshot, ForkBody, Sandbox, SandboxList,
    Snapshot, SnapshotList, SnapshotPool, SnapshotPoolBody,
};
use crate::routes::sandboxes::metadata_filter;
use crate::{scope, ApiError, AppState};
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::Extension;
use hatchery_core::ForkRequest;
use hatchery_tenants::Principal;

#[utoipa::path(post, path = "/v1/sandboxes/{id}/snapshots", tag = "snapshots", params(("id" = String, Path)),
    request_body = CreateSnapshot,
    responses((status = 201, body = Snapshot), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "files_too_large: a files-only snapshot over the sandbox's disk plus 64 MiB", body = ErrorBody),
        (status = 507, description = "snapshot_store_full: the snapshot store would pass its storage cap (--snapshot-store-max-mb); nothing kept", body = ErrorBody)))]
pub async fn create(
    State(st): State<AppState>,
    principal: Option<Extension<Principal>>,
    Path(id): Path<String>,
    Json(mut body): Json<CreateSnapshot>,
) -> Result<(StatusCode, axum::Json<Snapshot>), ApiError> {
    let caps = &st.manager.caps;
    scope::stamp(principal.as_ref().map(|e| &e.0), &mut body.metadata);
    validate_metadata(&body.metadata, caps)?;
    let retention = bounded(
        body.retention_seconds,
        caps.default_retention_s,
        caps.max_retention_s,
        "retention_seconds",
    )?;
    let snap = if body.memory.unwrap_or(true) {
        st.manager
            .snapshot(&id, Some(retention), body.metadata)
            .await?
    } else {
        st.manager
            .snapshot_files(&id, Some(retention), body.metadata)
            .await?
    };
    Ok((StatusCode::CREATED, axum::Json(snap.into())))
}

#[utoipa::path(get, path = "/v1/snapshots", tag = "snapshots",
    params(("metadata.KEY" = Option<String>, Query, description = "filter on a metadata entry; repeatable")),
    responses((status = 200, body = SnapshotList), (status = 400, body = ErrorBody)))]
pub async fn list(
    State(st): State<AppState>,
    principal: Option<Extension<Principal>>,
    RawQuery(q): RawQuery,
) -> Result<axum::Json<SnapshotList>, ApiError> {
    let mut filter = metadata_filter(q)?;
    scope::stamp(principal.as_ref().map(|e| &e.0), &mut filter);
    let snapshots = st
        .manager
        .list_snapshots(&filter)
        .await?
        .into_iter()
        .map(Into::into)
        .collect();
    Ok(axum::Json(SnapshotList { snapshots }))
}

#[utoipa::path(get, path = "/v1/snapshots/{id}", tag = "snapshots", params(("id" = String, Path)),
    responses((status = 200, body = Snapshot), (status = 404, body = ErrorBody)))]
pub async fn get(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<axum::Json<Snapshot>, ApiError> {
    Ok(axum::Json(st.manager.get_snapshot(&id).await?.into()))
}

/// Idempotent; the files are removed at once.
#[utoipa::path(delete, path = "/v1/snapshots/{id}", tag = "snapshots", params(("id" = String, Path)),
    responses((status = 204)))]
pub async fn delete(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    st.manager.delete_snapshot(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Restores the snapshot into `count` new, independent sandboxes.
#[utoipa::path(post, path = "/v1/snapshots/{id}/fork", tag = "snapshots", params(("id" = String, Path)),
    request_body = ForkBody,
    responses((status = 201, body = SandboxList), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 422, body = ErrorBody, description = "snapshot_corrupt: the image failed its checksum"),
              (status = 429, body = ErrorBody, description = "tenant_limit: the tenant's live_sandboxes limit has no room for count more")))]
pub async fn fork(
    State(st): State<AppState>,
    principal: Option<Extension<Principal>>,
    Path(id): Path<String>,
    Json(mut body): Json<ForkBody>,
) -> Result<(StatusCode, axum::Json<SandboxList>), ApiError> {
    let caps = &st.manager.caps;
    let ttl = validate_ttl(body.ttl_seconds, caps)?;
    let principal = principal.as_ref().map(|e| &e.0);
    scope::stamp(principal, &mut body.metadata);
    validate_metadata(&body.metadata, caps)?;
    let count = bounded(body.count, 1, caps.max_fork_count as u64, "count")? as usize;
    let req = ForkRequest {
        ttl_seconds: Some(ttl),
        metadata: body.metadata,
        count,
        network: body.network.map(Into::into).unwrap_or_default(),
    };
    let _admitted = scope::admit(&st, principal, &req.metadata, count as u64).await?;
    let sandboxes: Vec<Sandbox> = st
        .manager
        .fork(&id, req)
        .await?
        .into_iter()
        .map(Into::into)
        .collect();
    Ok((StatusCode::CREATED, axum::Json(SandboxList { sandboxes })))
}

/// Keeps `size` forks of the snapshot restored and parked on this host, so
/// that a fork claims one instead of restoring (the sessions service does
/// it for a hot environment version). The operator's: a pool holds host
/// memory.
#[utoipa::path(put, path = "/v1/snapshots/{id}/pool", tag = "snapshots", params(("id" = String, Path)),
    request_body = SnapshotPoolBody,
    responses((status = 200, body = SnapshotPool), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn put_pool(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Json(body): Json<SnapshotPoolBody>,
) -> Result<axum::Json<SnapshotPool>, ApiError> {
    let size = usize::try_from(body.size).unwrap_or(usize::MAX);
    Ok(axum::Json(
        st.manager.set_snapshot_pool(&id, size).await?.into(),
    ))
}

#[utoipa::path(get, path = "/v1/snapshots/{id}/pool", tag = "snapshots", params(("id" = String, Path)),
    responses((status = 200, body = SnapshotPool), (status = 404, body = ErrorBody)))]
pub async fn get_pool(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<axum::Json<SnapshotPool>, ApiError> {
    st.manager.get_snapshot(&id).await?;
    Ok(axum::Json(st.manager.snapshot_pool(&id).into()))
}
