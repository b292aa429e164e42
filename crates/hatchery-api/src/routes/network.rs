use crate::error::ErrorBody;
use crate::extract::Json;
use crate::network::{EgressEventList, NetworkPolicy};
use crate::{ApiError, AppState};
use axum::extract::{Path, State};

#[utoipa::path(get, path = "/v1/sandboxes/{id}/network", tag = "network", params(("id" = String, Path)),
    responses((status = 200, body = NetworkPolicy), (status = 404, body = ErrorBody)))]
pub async fn get(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<axum::Json<NetworkPolicy>, ApiError> {
    Ok(axum::Json(st.manager.network_policy(&id).await?.into()))
}

/// Replaces the policy. When this returns, new connections follow it, and
/// open connections it no longer allows are cut (TCP reset).
#[utoipa::path(put, path = "/v1/sandboxes/{id}/network", tag = "network", params(("id" = String, Path)),
    request_body = NetworkPolicy,
    responses((status = 200, body = NetworkPolicy), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody, description = "networking is off on this daemon")))]
pub async fn put(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Json(body): Json<NetworkPolicy>,
) -> Result<axum::Json<NetworkPolicy>, ApiError> {
    let applied = st.manager.set_network_policy(&id, body.into()).await?;
    Ok(axum::Json(applied.into()))
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/network/events", tag = "network", params(("id" = String, Path)),
    responses((status = 200, body = EgressEventList), (status = 404, body = ErrorBody)))]
pub async fn events(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<axum::Json<EgressEventList>, ApiError> {
    let events = st
        .manager
        .network_events(&id)
        .await?
        .into_iter()
        .map(Into::into)
        .collect();
    let denied_total = st.manager.network_denied_total(&id).await?;
    Ok(axum::Json(EgressEventList {
        events,
        denied_total,
    }))
}
