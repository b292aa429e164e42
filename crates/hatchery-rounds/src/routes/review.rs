//! The reviewer's routes (a reviewer token of the round, or the API key):
//! sessions, runs, reports, submissions, regrades, replays and forks.

use crate::error::ErrorBody;
use crate::extract::Json;
use crate::models::*;
use crate::{Caller, Rounds, RoundsError};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use std::sync::Arc;

type St = State<Arc<Rounds>>;

#[utoipa::path(get, path = "/v1/rounds/{id}/sessions", tag = "rounds", params(("id" = String, Path)),
    responses((status = 200, body = SessionList), (status = 403, body = ErrorBody)))]
pub async fn sessions(
    State(st): St,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<axum::Json<SessionList>, RoundsError> {
    caller.require_reviewer(&id)?;
    Ok(axum::Json(SessionList {
        sessions: st.list_sessions(&id).await?,
    }))
}

/// The candidate's runs, oldest first (the last 200).
#[utoipa::path(get, path = "/v1/rounds/{id}/sessions/{sid}/runs", tag = "rounds",
    params(("id" = String, Path), ("sid" = String, Path)), responses((status = 200, body = RunList)))]
pub async fn runs(
    State(st): St,
    caller: Caller,
    Path((id, sid)): Path<(String, String)>,
) -> Result<axum::Json<RunList>, RoundsError> {
    caller.require_reviewer(&id)?;
    let (_, s) = st.session(&id, &sid).await?;
    Ok(axum::Json(RunList {
        runs: st.list_runs(&s.id).await?,
    }))
}

/// The full grading report: assertion text, per-case time, output.
#[utoipa::path(get, path = "/v1/rounds/{id}/sessions/{sid}/report", tag = "rounds",
    params(("id" = String, Path), ("sid" = String, Path)), responses((status = 200, body = Report), (status = 403, body = ErrorBody)))]
pub async fn report(
    State(st): St,
    caller: Caller,
    Path((id, sid)): Path<(String, String)>,
) -> Result<axum::Json<Report>, RoundsError> {
    caller.require_reviewer(&id)?;
    Ok(axum::Json(st.report(&id, &sid).await?))
}

#[utoipa::path(get, path = "/v1/rounds/{id}/sessions/{sid}/submissions/{sub}", tag = "rounds",
    params(("id" = String, Path), ("sid" = String, Path), ("sub" = String, Path)),
    responses((status = 200, body = SubmissionFiles), (status = 404, body = ErrorBody)))]
pub async fn submission(
    State(st): St,
    caller: Caller,
    Path((id, sid, sub)): Path<(String, String, String)>,
) -> Result<axum::Json<SubmissionFiles>, RoundsError> {
    caller.require_reviewer(&id)?;
    Ok(axum::Json(st.submission_files(&id, &sid, &sub).await?))
}

/// Grades the same captured files again in a new grader (an appeal).
#[utoipa::path(post, path = "/v1/rounds/{id}/sessions/{sid}/submissions/{sub}/regrade", tag = "rounds",
    params(("id" = String, Path), ("sid" = String, Path), ("sub" = String, Path)),
    responses((status = 200, body = GradingReport), (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody, description = "grading_in_progress: the first grading of this submission still runs")))]
pub async fn regrade(
    State(st): St,
    caller: Caller,
    Path((id, sid, sub)): Path<(String, String, String)>,
) -> Result<axum::Json<GradingReport>, RoundsError> {
    caller.require_reviewer(&id)?;
    Ok(axum::Json(st.regrade(&id, &sid, &sub).await?))
}

/// A replay now (the session goes on).
#[utoipa::path(post, path = "/v1/rounds/{id}/sessions/{sid}/replays", tag = "rounds",
    params(("id" = String, Path), ("sid" = String, Path)),
    responses((status = 201, body = Replay), (status = 409, body = ErrorBody)))]
pub async fn take_replay(
    State(st): St,
    caller: Caller,
    Path((id, sid)): Path<(String, String)>,
) -> Result<(StatusCode, axum::Json<Replay>), RoundsError> {
    caller.require_reviewer(&id)?;
    Ok((
        StatusCode::CREATED,
        axum::Json(st.replay_now(&id, &sid).await?),
    ))
}

#[utoipa::path(get, path = "/v1/rounds/{id}/sessions/{sid}/replays", tag = "rounds",
    params(("id" = String, Path), ("sid" = String, Path)), responses((status = 200, body = ReplayList)))]
pub async fn replays(
    State(st): St,
    caller: Caller,
    Path((id, sid)): Path<(String, String)>,
) -> Result<axum::Json<ReplayList>, RoundsError> {
    caller.require_reviewer(&id)?;
    Ok(axum::Json(ReplayList {
        replays: st.list_replays(&id, &sid).await?,
    }))
}

#[utoipa::path(get, path = "/v1/rounds/{id}/replays/{rid}", tag = "rounds",
    params(("id" = String, Path), ("rid" = String, Path)), responses((status = 200, body = Replay), (status = 404, body = ErrorBody)))]
pub async fn replay(
    State(st): St,
    caller: Caller,
    Path((id, rid)): Path<(String, String)>,
) -> Result<axum::Json<Replay>, RoundsError> {
    caller.require_reviewer(&id)?;
    Ok(axum::Json(st.get_replay(&id, &rid).await?))
}

/// The caller's own fork of a replay, with deny-all egress (1 h TTL).
#[utoipa::path(post, path = "/v1/rounds/{id}/replays/{rid}/forks", tag = "rounds",
    params(("id" = String, Path), ("rid" = String, Path)),
    responses((status = 201, body = Fork), (status = 409, body = ErrorBody, description = "replay_expired, too_many_forks")))]
pub async fn fork(
    State(st): St,
    caller: Caller,
    Path((id, rid)): Path<(String, String)>,
) -> Result<(StatusCode, axum::Json<Fork>), RoundsError> {
    caller.require_reviewer(&id)?;
    Ok((
        StatusCode::CREATED,
        axum::Json(st.fork_replay(&id, &rid, &caller).await?),
    ))
}

#[utoipa::path(get, path = "/v1/rounds/{id}/forks/{fid}/files", tag = "rounds",
    params(("id" = String, Path), ("fid" = String, Path)), responses((status = 200, body = FileTree), (status = 404, body = ErrorBody)))]
pub async fn fork_files(
    State(st): St,
    caller: Caller,
    Path((id, fid)): Path<(String, String)>,
) -> Result<axum::Json<FileTree>, RoundsError> {
    caller.require_reviewer(&id)?;
    Ok(axum::Json(st.fork_files(&id, &fid, &caller).await?))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathQuery {
    path: String,
}

#[utoipa::path(get, path = "/v1/rounds/{id}/forks/{fid}/file", tag = "rounds",
    params(("id" = String, Path), ("fid" = String, Path), ("path" = String, Query)),
    responses((status = 200, body = FileContent), (status = 404, body = ErrorBody)))]
pub async fn fork_file(
    State(st): St,
    caller: Caller,
    Path((id, fid)): Path<(String, String)>,
    q: Result<Query<PathQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<axum::Json<FileContent>, RoundsError> {
    caller.require_reviewer(&id)?;
    let Query(q) = q.map_err(|e| RoundsError::Invalid(e.body_text()))?;
    Ok(axum::Json(st.fork_file(&id, &fid, &q.path, &caller).await?))
}

#[utoipa::path(post, path = "/v1/rounds/{id}/forks/{fid}/exec", tag = "rounds",
    params(("id" = String, Path), ("fid" = String, Path)), request_body = ForkExecBody,
    responses((status = 200, body = ForkExecResult), (status = 404, body = ErrorBody)))]
pub async fn fork_exec(
    State(st): St,
    caller: Caller,
    Path((id, fid)): Path<(String, String)>,
    Json(body): Json<ForkExecBody>,
) -> Result<axum::Json<ForkExecResult>, RoundsError> {
    caller.require_reviewer(&id)?;
    Ok(axum::Json(st.fork_exec(&id, &fid, body, &caller).await?))
}

#[utoipa::path(delete, path = "/v1/rounds/{id}/forks/{fid}", tag = "rounds",
    params(("id" = String, Path), ("fid" = String, Path)), responses((status = 204), (status = 404, body = ErrorBody)))]
pub async fn delete_fork(
    State(st): St,
    caller: Caller,
    Path((id, fid)): Path<(String, String)>,
) -> Result<StatusCode, RoundsError> {
    caller.require_reviewer(&id)?;
    st.delete_fork(&id, &fid, &caller).await?;
    Ok(StatusCode::NO_CONTENT)
}
