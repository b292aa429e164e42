//! The candidate's routes (their token, or the API key): the session,
//! its files, Run (plain and SSE), Submit, a terminal, End.

use crate::error::ErrorBody;
use crate::extract::OptJson;
use crate::models::*;
use crate::run_ops::RunEvent;
use crate::{Caller, Rounds, RoundsError};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::IntoResponse;
use futures::StreamExt;
use std::collections::BTreeMap;
use std::sync::Arc;

type St = State<Arc<Rounds>>;

/// Candidates, reviewers and interviewers of the round, and the API key. A candidate's
/// first look moves the session from `ready` to `live`. The `result` has
/// counts and failed case names only.
#[utoipa::path(get, path = "/v1/rounds/{id}/sessions/{sid}", tag = "rounds",
    params(("id" = String, Path), ("sid" = String, Path)),
    responses((status = 200, body = Session), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn get(
    State(st): St,
    caller: Caller,
    Path((id, sid)): Path<(String, String)>,
) -> Result<axum::Json<Session>, RoundsError> {
    match &caller {
        Caller::Candidate(_) => caller.require_candidate(&id, &sid)?,
        Caller::Interviewer(_) => caller.require_interviewer(&id)?,
        _ => caller.require_reviewer(&id)?,
    }
    let (r, mut s) = st.session(&id, &sid).await?;
    if caller.is_candidate() {
        s.state = st.join(&s).await?;
    }
    Ok(axum::Json(st.session_view(&s, &r).await?))
}

#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct CandidateFiles {
    /// Everything under `/work`, `{path: text}`.
    pub files: BTreeMap<String, String>,
}

#[utoipa::path(get, path = "/v1/rounds/{id}/sessions/{sid}/files", tag = "rounds",
    params(("id" = String, Path), ("sid" = String, Path)),
    responses((status = 200, body = CandidateFiles), (status = 409, body = ErrorBody)))]
pub async fn files(
    State(st): St,
    caller: Caller,
    Path((id, sid)): Path<(String, String)>,
) -> Result<axum::Json<CandidateFiles>, RoundsError> {
    caller.require_candidate(&id, &sid)?;
    let (_, s) = st.session(&id, &sid).await?;
    Ok(axum::Json(CandidateFiles {
        files: st.candidate_files(&s).await?,
    }))
}

/// Writes `files` into `/work` and runs the round's command under its
/// limits. 409 `grading_in_progress`, `run_in_progress`, `session_ended`.
#[utoipa::path(post, path = "/v1/rounds/{id}/sessions/{sid}/run", tag = "rounds",
    params(("id" = String, Path), ("sid" = String, Path)), request_body = RunBody,
    responses((status = 200, body = RunResult), (status = 400, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody)))]
pub async fn run(
    State(st): St,
    caller: Caller,
    Path((id, sid)): Path<(String, String)>,
    OptJson(body): OptJson<RunBody>,
) -> Result<axum::Json<RunResult>, RoundsError> {
    caller.require_candidate(&id, &sid)?;
    Ok(axum::Json(st.run(&id, &sid, body).await?))
}

/// The same Run over SSE: `stdout` and `stderr` `{"data"}` as it runs
/// (the first 64 KiB live), then `result` (the RunResult) or `error`.
#[utoipa::path(post, path = "/v1/rounds/{id}/sessions/{sid}/run/stream", tag = "rounds",
    params(("id" = String, Path), ("sid" = String, Path)), request_body = RunBody,
    responses((status = 200, content_type = "text/event-stream", description = "stdout, stderr, result | error"),
              (status = 409, body = ErrorBody)))]
pub async fn run_stream(
    State(st): St,
    caller: Caller,
    Path((id, sid)): Path<(String, String)>,
    OptJson(body): OptJson<RunBody>,
) -> Result<impl IntoResponse, RoundsError> {
    caller.require_candidate(&id, &sid)?;
    let events = st.run_stream(&id, &sid, body).await?;
    let sse = events.map(|ev| {
        let e = match ev {
            RunEvent::Stdout(d) => Event::default()
                .event("stdout")
                .json_data(serde_json::json!({ "data": d })),
            RunEvent::Stderr(d) => Event::default()
                .event("stderr")
                .json_data(serde_json::json!({ "data": d })),
            RunEvent::Result(r) => Event::default().event("result").json_data(r),
            RunEvent::Error(e) => {
                let (_, code) = e.status_code();
                Event::default().event("error").json_data(
                    serde_json::json!({"error": {"code": code, "message": e.to_string()}}),
                )
            }
        };
        Ok::<_, std::convert::Infallible>(e.unwrap_or_default())
    });
    Ok(Sse::new(sse).keep_alive(KeepAlive::default()))
}

/// Captures the files under `/work` (after writing `files`, if given) and
/// grades them in a fresh grader. 409 when a grading is in progress or
/// the session has ended.
#[utoipa::path(post, path = "/v1/rounds/{id}/sessions/{sid}/submit", tag = "rounds",
    params(("id" = String, Path), ("sid" = String, Path)), request_body = SubmitBody,
    responses((status = 202, body = SubmitAccepted), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody)))]
pub async fn submit(
    State(st): St,
    caller: Caller,
    Path((id, sid)): Path<(String, String)>,
    OptJson(body): OptJson<SubmitBody>,
) -> Result<(StatusCode, axum::Json<SubmitAccepted>), RoundsError> {
    caller.require_candidate(&id, &sid)?;
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(st.submit(&id, &sid, body).await?),
    ))
}

/// A one-use token for the session sandbox's terminal (60 s).
#[utoipa::path(post, path = "/v1/rounds/{id}/sessions/{sid}/terminal", tag = "rounds",
    params(("id" = String, Path), ("sid" = String, Path)),
    responses((status = 200, body = TerminalGrant), (status = 409, body = ErrorBody)))]
pub async fn terminal(
    State(st): St,
    caller: Caller,
    Path((id, sid)): Path<(String, String)>,
) -> Result<axum::Json<TerminalGrant>, RoundsError> {
    caller.require_candidate(&id, &sid)?;
    let (_, s) = st.session(&id, &sid).await?;
    Ok(axum::Json(st.terminal(&s).await?))
}

/// Ends the session: a final replay, then the sandbox is deleted.
#[utoipa::path(post, path = "/v1/rounds/{id}/sessions/{sid}/end", tag = "rounds",
    params(("id" = String, Path), ("sid" = String, Path)),
    responses((status = 200, body = Session), (status = 404, body = ErrorBody)))]
pub async fn end(
    State(st): St,
    caller: Caller,
    Path((id, sid)): Path<(String, String)>,
) -> Result<axum::Json<Session>, RoundsError> {
    caller.require_candidate(&id, &sid)?;
    let (r, s) = st.session(&id, &sid).await?;
    st.end_session(&s, "ended").await?;
    let (_, s) = st.session(&id, &sid).await?;
    Ok(axum::Json(st.session_view(&s, &r).await?))
}
