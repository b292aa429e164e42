//! `/v1/environments` routes, mounted by the sessions router (same API
//! key, same body cap). The caller's [`Principal`] (auth.rs) scopes each:
//! a tenant key creates environments of its tenant and reaches only
//! those (another's, the operator's included, is 404
//! `environment_not_found`, as a missing one); the operator key reaches
//! all.

use crate::api_state::ApiState;
use crate::environments::models::*;
use crate::environments::progress::BuildEvent;
use crate::environments::{EnvError, Environments};
use crate::extract::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Extension;
use axum::Router;
use hatchery_tenants::Principal;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

pub(crate) fn routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/environments", get(list).post(create))
        .route(
            "/v1/environments/{id}",
            get(get_one).delete(delete).post(colon_action),
        )
}

fn envs(st: &ApiState) -> Result<Arc<Environments>, EnvError> {
    st.sessions
        .environments()
        .ok_or_else(|| EnvError::Invalid("environments are not enabled on this daemon".into()))
}

#[utoipa::path(post, path = "/v1/environments", tag = "environments", request_body = CreateEnvironment,
    description = "Creates an environment (no version yet: build it). Checks the repository URL, ref, template and set-up caps; nothing is written on a 4xx.",
    responses((status = 201, body = EnvironmentView), (status = 400, body = crate::error::ErrorBody),
              (status = 404, body = crate::error::ErrorBody), (status = 409, body = crate::error::ErrorBody)))]
pub async fn create(
    State(st): State<ApiState>,
    Extension(who): Extension<Principal>,
    Json(body): Json<CreateEnvironment>,
) -> Result<Response, EnvError> {
    let v = envs(&st)?.create(body, who.tenant()).await?;
    Ok((StatusCode::CREATED, axum::Json(v)).into_response())
}

#[utoipa::path(get, path = "/v1/environments", tag = "environments",
    responses((status = 200, body = EnvironmentList)))]
pub async fn list(
    State(st): State<ApiState>,
    Extension(who): Extension<Principal>,
) -> Result<axum::Json<EnvironmentList>, EnvError> {
    Ok(axum::Json(envs(&st)?.list(who.tenant()).await?))
}

#[utoipa::path(get, path = "/v1/environments/{id}", tag = "environments",
    responses((status = 200, body = EnvironmentView), (status = 404, body = crate::error::ErrorBody)))]
pub async fn get_one(
    State(st): State<ApiState>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<axum::Json<EnvironmentView>, EnvError> {
    Ok(axum::Json(envs(&st)?.get(&id, who.tenant()).await?))
}

#[utoipa::path(delete, path = "/v1/environments/{id}", tag = "environments",
    description = "Deletes the environment and its snapshots. 409 while a build of it runs or an unfinished session uses it.",
    responses((status = 204), (status = 404, body = crate::error::ErrorBody), (status = 409, body = crate::error::ErrorBody)))]
pub async fn delete(
    State(st): State<ApiState>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<StatusCode, EnvError> {
    envs(&st)?.delete(&id, who.tenant()).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn colon_action(
    st: State<ApiState>,
    who: Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Response, EnvError> {
    match id.split_once(':') {
        Some((eid, "build")) => build(st, who, Path(eid.to_string())).await,
        _ => Err(EnvError::Invalid(
            "POST /v1/environments/{id} takes an action: {id}:build".into(),
        )),
    }
}

#[utoipa::path(post, path = "/v1/environments/{id}:build", tag = "environments",
    description = "Builds a new version and streams its progress (text/event-stream): `step` {step, percent}, `log` {line}, then `done` {environment_id, version, base_commit, snapshot_id} or `error` {error:{code,message}}. The build goes on if the client goes away; the previous version stays current until the new one is ready, and a failed build makes no version (`last_error` says why).",
    responses((status = 200, description = "the build's events", content_type = "text/event-stream"),
              (status = 404, body = crate::error::ErrorBody), (status = 409, body = crate::error::ErrorBody)))]
pub async fn build(
    State(st): State<ApiState>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Response, EnvError> {
    let p = envs(&st)?.start_build(&id, who.tenant()).await?;
    let (history, rx) = p.subscribe();
    let sse = |ev: &BuildEvent| {
        Ok::<_, Infallible>(
            SseEvent::default()
                .event(ev.name())
                .data(ev.data().to_string()),
        )
    };
    let done = history.iter().any(BuildEvent::is_last);
    let first = futures::stream::iter(history.iter().map(sse).collect::<Vec<_>>());
    let live = futures::stream::unfold((rx, done), move |(mut rx, done)| async move {
        if done {
            return None;
        }
        loop {
            match rx.recv().await {
                Ok(ev) => {
                    let last = ev.is_last();
                    return Some((sse(&ev), (rx, last)));
                }
                // Behind the live stream: skip what was missed.
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    use futures::StreamExt;
    Ok(Sse::new(first.chain(live))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}
