use crate::error::ErrorBody;
use crate::extract::Json;
use crate::models::{
    BuildAccepted, BuildProgress, CreateTemplate, TemplateInfo, TemplateList, TemplateState,
};
use crate::{ApiError, AppState};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::stream::{self, Stream, StreamExt};
use hatchery_core::builds::{Build, BuildEvent};
use hatchery_templates::{Template, TemplateError, TemplateSpec};
use std::convert::Infallible;
use tokio_stream::wrappers::BroadcastStream;

fn events_url(name: &str, id: &str) -> String {
    format!("/v1/templates/{name}/builds/{id}/events")
}

fn progress(b: &Build) -> BuildProgress {
    let (step, percent) = b.progress();
    BuildProgress {
        build_id: b.id.clone(),
        version: b.version.clone(),
        step,
        percent,
        events_url: events_url(&b.name, &b.id),
    }
}

/// A template as the API shows it: its current version when there is one
/// (`ready`), else the spec of its build (`building`).
fn info(st: &AppState, t: Option<Template>, build: Option<&Build>) -> Option<TemplateInfo> {
    let (spec, version, checkpoint_ready, state) = match (t, build) {
        (Some(t), _) => {
            let ready = st.manager.template_image(&t).is_some();
            (t.spec, t.version, ready, TemplateState::Ready)
        }
        (None, Some(b)) => (
            b.spec.clone(),
            b.version.clone(),
            false,
            TemplateState::Building,
        ),
        (None, None) => return None,
    };
    let TemplateSpec {
        name,
        base,
        packages,
        pip,
        files,
        setup,
        cpus,
        memory_mb,
        pids_max,
        disk_mb,
    } = spec;
    Some(TemplateInfo {
        name,
        version,
        base,
        packages,
        pip,
        files: files.into_keys().collect(),
        setup,
        cpus,
        memory_mb,
        pids_max,
        disk_mb,
        checkpoint_ready,
        state,
        build: build.map(progress),
    })
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
            events_url: events_url(&build.name, &build.id),
            build_id: build.id.clone(),
            name: build.name.clone(),
            version: build.version.clone(),
        }),
    ))
}

/// Every template: the ready ones and those only being built, by name.
#[utoipa::path(get, path = "/v1/templates", tag = "templates", responses((status = 200, body = TemplateList)))]
pub async fn list(State(st): State<AppState>) -> axum::Json<TemplateList> {
    let mut builds = st.manager.running_builds();
    let mut templates: Vec<TemplateInfo> = st
        .manager
        .templates()
        .list()
        .into_iter()
        .filter_map(|t| {
            let b = builds
                .iter()
                .position(|b| b.name == t.spec.name)
                .map(|i| builds.remove(i));
            info(&st, Some(t), b.as_deref())
        })
        .collect();
    templates.extend(builds.iter().filter_map(|b| info(&st, None, Some(b))));
    templates.sort_by(|a, b| a.name.cmp(&b.name));
    axum::Json(TemplateList { templates })
}

#[utoipa::path(get, path = "/v1/templates/{name}", tag = "templates", params(("name" = String, Path)),
    responses((status = 200, body = TemplateInfo), (status = 404, body = ErrorBody)))]
pub async fn get(
    State(st): State<AppState>,
    Path(name): Path<String>,
) -> Result<axum::Json<TemplateInfo>, ApiError> {
    let build = st.manager.running_build_of(&name);
    let t = match st.manager.templates().get(&name) {
        Err(TemplateError::NotFound(_)) if build.is_some() => None,
        other => Some(other.map_err(hatchery_core::CoreError::from)?),
    };
    let found = info(&st, t, build.as_deref());
    // info() is None only without both, which the match above refused.
    found
        .map(axum::Json)
        .ok_or_else(|| hatchery_core::CoreError::from(TemplateError::NotFound(name)).into())
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
