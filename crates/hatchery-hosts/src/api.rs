//! `GET /v1/hosts`, `GET /v1/hosts/{id}` and the operator's
//! `POST /v1/hosts/{id}:cordon`, `:uncordon` and `:drain`, answered from
//! the shared store by any role (every daemon on it sees the same hosts).
//! Operator-only: the deployment's API key, nothing narrower.
//!
//! A drain stops placement and marks the host `draining`; the host sees
//! its hold within a second and moves its sessions to other hosts
//! (crate::shedding). Its progress is the host's `live_sessions` falling
//! to 0 (and its log).

use crate::api_error::HostsApiError;
use crate::sessions_count::SessionCounts;
use crate::view::{Host, HostList};
use axum::extract::{Path, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use axum::routing::get;
use axum::{Json, Router};
use hatchery_store::{HostHold, SandboxFilter, Store};
use std::sync::Arc;

#[derive(Clone)]
pub struct HostsApi {
    pub store: Arc<dyn Store>,
    pub lease_ttl_ms: u64,
    pub api_key: Arc<str>,
    /// Where sessions are counted; `None`: shown as 0.
    pub sessions: Option<Arc<dyn SessionCounts>>,
}

pub fn router(st: HostsApi) -> Router {
    Router::new()
        .route("/v1/hosts", get(list))
        .route("/v1/hosts/{id}", get(get_one).post(colon_action))
        .layer(axum::middleware::from_fn_with_state(
            st.clone(),
            require_key,
        ))
        .with_state(st)
}

async fn require_key(
    State(st): State<HostsApi>,
    req: Request,
    next: Next,
) -> Result<Response, HostsApiError> {
    if !hatchery_serve::headers::api_key_ok(req.headers(), &st.api_key) {
        return Err(HostsApiError::Unauthorized);
    }
    Ok(next.run(req).await)
}

impl HostsApi {
    async fn all(&self) -> Result<Vec<Host>, HostsApiError> {
        let rows = self
            .store
            .list_hosts()
            .await
            .map_err(HostsApiError::Store)?;
        let live = self
            .store
            .live_per_host(&SandboxFilter::default())
            .await
            .map_err(HostsApiError::Store)?;
        let sessions = match &self.sessions {
            Some(s) => s.per_host().await.map_err(HostsApiError::Sessions)?,
            None => Default::default(),
        };
        Ok(rows
            .into_iter()
            .map(|h| Host::of(h, self.lease_ttl_ms, &live, &sessions))
            .collect())
    }

    async fn one(&self, id: &str) -> Result<Host, HostsApiError> {
        if !hatchery_store::valid_host_id(id) {
            return Err(HostsApiError::BadId(id.into()));
        }
        let all = self.all().await?;
        all.into_iter()
            .find(|h| h.id == id)
            .ok_or_else(|| HostsApiError::NotFound(id.into()))
    }

    /// Moves `id`'s hold to `to` from wherever it validly may; asking
    /// twice is no error.
    async fn hold(&self, id: &str, to: HostHold) -> Result<Host, HostsApiError> {
        if !hatchery_store::valid_host_id(id) {
            return Err(HostsApiError::BadId(id.into()));
        }
        let moved = self
            .store
            .hold_host(id, &HostHold::sources(to), to)
            .await
            .map_err(HostsApiError::Store)?;
        let host = self.one(id).await?;
        tracing::info!(host = %id, hold = %to, moved, state = %host.state, "host hold set by the operator");
        Ok(host)
    }
}

#[utoipa::path(get, path = "/v1/hosts", tag = "hosts",
    description = "Every host registered in the shared store, with its state and load.",
    responses((status = 200, body = HostList), (status = 401, body = crate::api_error::ErrorBody),
              (status = 503, body = crate::api_error::ErrorBody)))]
pub async fn list(State(st): State<HostsApi>) -> Result<Json<HostList>, HostsApiError> {
    Ok(Json(HostList {
        hosts: st.all().await?,
    }))
}

#[utoipa::path(get, path = "/v1/hosts/{id}", tag = "hosts",
    responses((status = 200, body = Host), (status = 400, body = crate::api_error::ErrorBody),
              (status = 404, body = crate::api_error::ErrorBody)))]
pub async fn get_one(
    State(st): State<HostsApi>,
    Path(id): Path<String>,
) -> Result<Json<Host>, HostsApiError> {
    Ok(Json(st.one(&id).await?))
}

/// `POST /v1/hosts/{id}:cordon`: the router sees `{id}` = `h1:cordon`.
async fn colon_action(
    State(st): State<HostsApi>,
    Path(id): Path<String>,
) -> Result<Json<Host>, HostsApiError> {
    match id.split_once(':') {
        Some((h, "cordon")) => cordon(State(st), Path(h.into())).await,
        Some((h, "uncordon")) => uncordon(State(st), Path(h.into())).await,
        Some((h, "drain")) => drain(State(st), Path(h.into())).await,
        _ => Err(HostsApiError::BadAction(id)),
    }
}

#[utoipa::path(post, path = "/v1/hosts/{id}:cordon", tag = "hosts",
    description = "No new sandboxes or sessions are placed on the host; requests for the ones it runs are still routed to it. Idempotent; kept across the host's restarts.",
    responses((status = 200, body = Host), (status = 400, body = crate::api_error::ErrorBody),
              (status = 404, body = crate::api_error::ErrorBody)))]
pub async fn cordon(
    State(st): State<HostsApi>,
    Path(id): Path<String>,
) -> Result<Json<Host>, HostsApiError> {
    Ok(Json(st.hold(&id, HostHold::Cordoned).await?))
}

#[utoipa::path(post, path = "/v1/hosts/{id}:uncordon", tag = "hosts",
    description = "Ends a cordon or a drain: the host takes new sandboxes again once it is ready.",
    responses((status = 200, body = Host), (status = 400, body = crate::api_error::ErrorBody),
              (status = 404, body = crate::api_error::ErrorBody)))]
pub async fn uncordon(
    State(st): State<HostsApi>,
    Path(id): Path<String>,
) -> Result<Json<Host>, HostsApiError> {
    Ok(Json(st.hold(&id, HostHold::None).await?))
}

#[utoipa::path(post, path = "/v1/hosts/{id}:drain", tag = "hosts",
    description = "Stops placement on the host and marks it draining. Within about a second the host checkpoints each of its sessions and hands it to another ready host, where it resumes from that checkpoint (a `host_changed` event with reason `host_draining`); its `live_sessions` falls to 0 as they move (the progress), and then it may be stopped. Sandboxes without a session stay on it. Needs another ready host and a shared snapshot store; without them the sessions stay. An uncordon ends it.",
    responses((status = 200, body = Host), (status = 400, body = crate::api_error::ErrorBody),
              (status = 404, body = crate::api_error::ErrorBody)))]
pub async fn drain(
    State(st): State<HostsApi>,
    Path(id): Path<String>,
) -> Result<Json<Host>, HostsApiError> {
    Ok(Json(st.hold(&id, HostHold::Draining).await?))
}
