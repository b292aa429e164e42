use crate::error::ErrorBody;
use crate::extract::Json;
use crate::models::{BuildAccepted, CreateTemplate, TemplateInfo, TemplateList};
use crate::{ApiError, AppState};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::stream::{self, Stream, StreamExt};
use hatchery_core::builds::BuildEvent;
use hatchery_templates::Template;
use std::convert::Infallible;
use tokio_stream::wrappers::BroadcastStream;

fn info(st: &AppState, t: Template) -> TemplateInfo {
    let checkpoint_ready = st.manager.template_image(&t).is_some();
    let s = t.spec;
    TemplateInfo {
        name: s.name,
        version: t.version,
        base: s.base,
        packages: s.packages,
        pip: s.pip,
        files: s.files.into_keys().collect(),
        setup: s.setup,
        cpus: s.cpus,
        memory_mb: s.memory_mb,
        pids_max: s.pids_max,
        disk_mb: s.disk_mb,
        checkpoint_ready,
    }
}

/// Starts a build; follow it at `events_url`. Rebuilding a name makes a new
/// version; running sandboxes keep theirs.
#[utoipa::path(post, path = "/v1/templates", tag = "templates", request_body = CreateTemplate,
    responses((status = 202, body = BuildAccepted), (status = 400, body = ErrorBody),
              (status = 409, body = ErrorBody, description = "a build of this template is running")))]
pub async fn create(
    State(st): State<AppState>,
    Json(body): Json<CreateTemplate>,
) -> Result<(StatusCode, axum::Json<BuildAccepted>), ApiError> {
    let build = st.manager.build_template(body.into_spec()?)?;
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(BuildAccepted {
            events_url: format!("/v1/templates/{}/builds/{}/events", build.name, build.id),
            build_id: build.id.clone(),
            name: build.name.clone(),
            version: build.version.clone(),
        }),
    ))
}

#[utoipa::path(get, path = "/v1/templates", tag = "templates", responses((status = 200, body = TemplateList)))]
pub async fn list(State(st): State<AppState>) -> axum::Json<TemplateList> {
    let templates = st
        .manager
        .templates()
        .list()
        .into_iter()
        .map(|t| info(&st, t))
        .collect();
    axum::Json(TemplateList { templates })
}

#[utoipa::path(get, path = "/v1/templates/{name}", tag = "templates", params(("name" = String, Path)),
    responses((status = 200, body = TemplateInfo), (status = 404, body = ErrorBody)))]
pub async fn get(
    State(st): State<AppState>,
    Path(name): Path<String>,
) -> Result<axum::Json<TemplateInfo>, ApiError> {
    let t = st
        .manager
        .templates()
        .get(&name)
        .map_err(hatchery_core::CoreError::from)?;
    Ok(axum::Json(info(&st, t)))
}

#[utoipa::path(delete, path = "/v1/templates/{name}", tag = "templates", params(("name" = String, Path)),
    responses((status = 204), (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody, description = "running sandboxes use it")))]
pub async fn delete(
    State(st): State<AppState>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    st.manager.delete_template(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}

fn sse(ev: BuildEvent) -> Result<Event, Infallible> {
    Ok(Event::default()
        .event(ev.kind)
        .json_data(ev.data)
        .unwrap_or_default())
}

/// The build's progress as server-sent events, from the start.
#[utoipa::path(get, path = "/v1/templates/{name}/builds/{id}/events", tag = "templates",
    params(("name" = String, Path), ("id" = String, Path)),
    responses((status = 200, content_type = "text/event-stream", description = "step, log, done, error"),
              (status = 404, body = ErrorBody)))]
pub async fn events(
    State(st): State<AppState>,
    Path((name, id)): Path<(String, String)>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let build = st.manager.get_build(&name, &id).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "build_not_found",
            format!("no build {id} of {name}"),
        )
    })?;
    let (history, rx) = build.subscribe();
    let body = match rx {
        // Finished before we looked: the history holds everything.
        None => stream::iter(history).boxed(),
        Some(rx) => {
            // A lagging subscriber misses log lines rather than stalling
            // the build. The live stream stops before the final event,
            // which is then taken from the history, where it now is.
            let live = BroadcastStream::new(rx)
                .filter_map(|r| async move { r.ok() })
                .take_while(|ev| {
                    let more = ev.kind != "done" && ev.kind != "error";
                    async move { more }
                });
            let last = stream::once(async move {
                build
                    .subscribe()
                    .0
                    .into_iter()
                    .rev()
                    .find(|e| e.kind == "done" || e.kind == "error")
            })
            .filter_map(|e| async move { e });
            stream::iter(history).chain(live).chain(last).boxed()
        }
    }
    .map(sse);
    Ok(Sse::new(body).keep_alive(KeepAlive::default()))
}
