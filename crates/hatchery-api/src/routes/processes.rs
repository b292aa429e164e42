//! Background processes: list, output (replay + follow), stdin, signals,
//! wait, kill.

use crate::error::ErrorBody;
use crate::extract::{Body, Json, Query};
use crate::output::Utf8Carry;
use crate::process_models::*;
use crate::routes::exec::encode;
use crate::{ApiError, AppState};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::stream::{self, Stream, StreamExt};
use hatchery_core::procs::{self, ProcChunk};
use std::convert::Infallible;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

fn check(pid: &str) -> Result<(), ApiError> {
    if valid_process_id(pid) {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "{pid:?} is not a process id"
        )))
    }
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes", tag = "processes", params(("id" = String, Path)),
    responses((status = 200, body = ProcessList), (status = 404, body = ErrorBody)))]
pub async fn list(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<axum::Json<ProcessList>, ApiError> {
    let all = procs::list(&*st.manager.agent(&id).await?).await?;
    let mut processes = Vec::with_capacity(all.len());
    for p in all {
        processes.push(st.manager.explain_process(&id, p).await.into());
    }
    Ok(axum::Json(ProcessList { processes }))
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes/{pid}", tag = "processes",
    params(("id" = String, Path), ("pid" = String, Path)),
    responses((status = 200, body = ProcessInfo), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn get(
    State(st): State<AppState>,
    Path((id, pid)): Path<(String, String)>,
) -> Result<axum::Json<ProcessInfo>, ApiError> {
    check(&pid)?;
    let info = procs::get(&*st.manager.agent(&id).await?, &pid).await?;
    Ok(axum::Json(
        st.manager.explain_process(&id, info).await.into(),
    ))
}

/// Server-sent events: `stdout` / `stderr` (`ProcessChunk`: data and its
/// offset) from `offset` on, then one `exit` (or `end` when not following
/// and the process still runs) with its `ProcessInfo`. Closing the stream
/// stops reading, not the process.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes/{pid}/output", tag = "processes",
    params(("id" = String, Path), ("pid" = String, Path), OutputQuery),
    responses((status = 200, content_type = "text/event-stream", body = ProcessChunk,
               description = "events: stdout, stderr (ProcessChunk), exit or end (ProcessInfo), error (ErrorBody)"),
              (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn output(
    State(st): State<AppState>,
    Path((id, pid)): Path<(String, String)>,
    Query(q): Query<OutputQuery>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    check(&pid)?;
    let client = st.manager.agent(&id).await?;
    // 404 before the stream starts.
    procs::get(&client, &pid).await?;
    let enc = q.encoding.unwrap_or_default();
    let (tx, rx) = mpsc::channel::<ProcChunk>(16);
    let (offset, follow) = (q.offset.unwrap_or(0), q.follow.unwrap_or(true));
    let manager = std::sync::Arc::clone(&st.manager);
    let task = tokio::spawn(async move {
        let info = procs::read(&client, &pid, offset, follow, tx).await?;
        Ok::<_, hatchery_core::CoreError>(manager.explain_process(&id, info).await)
    });
    let mut carry = (Utf8Carry::default(), Utf8Carry::default());
    let chunks = ReceiverStream::new(rx).filter_map(move |c| {
        let c2 = if c.stderr { &mut carry.1 } else { &mut carry.0 };
        let data = encode(enc, c2, &c.data);
        let name = if c.stderr { "stderr" } else { "stdout" };
        let ev = (!data.is_empty()).then(|| {
            Ok(Event::default()
                .event(name)
                .json_data(ProcessChunk {
                    data,
                    offset: c.offset,
                })
                .unwrap_or_default())
        });
        async move { ev }
    });
    let last = stream::once(async move {
        let ev = match task.await {
            Ok(Ok(info)) => {
                let name = if info.running { "end" } else { "exit" };
                Event::default()
                    .event(name)
                    .json_data(ProcessInfo::from(info))
            }
            Ok(Err(e)) => Event::default()
                .event("error")
                .json_data(ApiError::from(e).body()),
            Err(e) => Event::default().event("error").json_data(
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()).body(),
            ),
        };
        Ok(ev.unwrap_or_default())
    });
    Ok(Sse::new(chunks.chain(last)).keep_alive(KeepAlive::default()))
}

/// The request body's bytes go to the process's stdin as they are (at most
/// 1 MiB per request).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/stdin", tag = "processes",
    params(("id" = String, Path), ("pid" = String, Path)),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 204), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody, description = "stdin is closed"), (status = 413, body = ErrorBody),
              (status = 429, body = ErrorBody, description = "over 4 MiB queued and not read by the process")))]
pub async fn stdin(
    State(st): State<AppState>,
    Path((id, pid)): Path<(String, String)>,
    Body(data): Body,
) -> Result<StatusCode, ApiError> {
    check(&pid)?;
    if data.len() > procs::MAX_STDIN_WRITE {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!("stdin writes are at most {} bytes", procs::MAX_STDIN_WRITE),
        ));
    }
    procs::write_stdin(&*st.manager.agent(&id).await?, &pid, &data).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/stdin/close", tag = "processes",
    params(("id" = String, Path), ("pid" = String, Path)),
    responses((status = 204), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn close_stdin(
    State(st): State<AppState>,
    Path((id, pid)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    check(&pid)?;
    procs::close_stdin(&*st.manager.agent(&id).await?, &pid).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/signal", tag = "processes",
    params(("id" = String, Path), ("pid" = String, Path)), request_body = SignalBody,
    responses((status = 200, body = ProcessInfo), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn signal(
    State(st): State<AppState>,
    Path((id, pid)): Path<(String, String)>,
    Json(body): Json<SignalBody>,
) -> Result<axum::Json<ProcessInfo>, ApiError> {
    check(&pid)?;
    let sig = parse_signal(&body.signal)
        .ok_or_else(|| ApiError::bad_request("unknown or disallowed signal"))?;
    if sig == 9 {
        st.manager.note_process_kill(&id, &pid).await?;
    }
    let info = procs::signal(&*st.manager.agent(&id).await?, &pid, sig).await?;
    Ok(axum::Json(
        st.manager.explain_process(&id, info).await.into(),
    ))
}

/// Answers when the process has exited, or after the timeout with it still
/// `running`.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/wait", tag = "processes",
    params(("id" = String, Path), ("pid" = String, Path), WaitQuery),
    responses((status = 200, body = ProcessInfo), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn wait(
    State(st): State<AppState>,
    Path((id, pid)): Path<(String, String)>,
    Query(q): Query<WaitQuery>,
) -> Result<axum::Json<ProcessInfo>, ApiError> {
    check(&pid)?;
    let max = procs::MAX_WAIT.as_secs();
    let secs = crate::models::bounded(q.timeout_seconds, 30, max, "timeout_seconds")?;
    let info = procs::wait(
        &*st.manager.agent(&id).await?,
        &pid,
        Duration::from_secs(secs),
    )
    .await?;
    Ok(axum::Json(
        st.manager.explain_process(&id, info).await.into(),
    ))
}

/// Kills the process and everything it started.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/processes/{pid}", tag = "processes",
    params(("id" = String, Path), ("pid" = String, Path)),
    responses((status = 200, body = ProcessInfo), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn kill(
    State(st): State<AppState>,
    Path((id, pid)): Path<(String, String)>,
) -> Result<axum::Json<ProcessInfo>, ApiError> {
    check(&pid)?;
    let client = st.manager.agent(&id).await?;
    st.manager.note_process_kill(&id, &pid).await?;
    procs::kill(&client, &pid).await?;
    // The answer after the kill has been reaped.
    let info = procs::wait(&client, &pid, Duration::from_secs(5)).await?;
    Ok(axum::Json(
        st.manager.explain_process(&id, info).await.into(),
    ))
}
