use crate::error::ErrorBody;
use crate::extract::Json;
use crate::models::{ExecBody, ExecResponse, OutputChunk};
use crate::{ApiError, AppState};
use axum::extract::{Path, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::stream::{self, Stream, StreamExt};
use hatchery_core::exec::{ExecEvent, Sink};
use std::convert::Infallible;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

#[utoipa::path(post, path = "/v1/sandboxes/{id}/exec", tag = "exec", params(("id" = String, Path)),
    request_body = ExecBody,
    responses((status = 200, body = ExecResponse), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody), (status = 504, body = ErrorBody)))]
pub async fn exec(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Json(body): Json<ExecBody>,
) -> Result<axum::Json<ExecResponse>, ApiError> {
    let params = body.into_params(&st.manager.caps)?;
    let out = st.manager.exec(&id, params, Sink::Collect).await?;
    Ok(axum::Json(out.into()))
}

/// Server-sent events: `stdout` and `stderr` with `{"data": "..."}`, then
/// exactly one `exit` with the same object as the non-streaming call (or
/// one `error` with the usual error body). Closing the connection kills the
/// command.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/exec/stream", tag = "exec", params(("id" = String, Path)),
    request_body = ExecBody,
    responses((status = 200, content_type = "text/event-stream", body = OutputChunk,
               description = "events: stdout, stderr (OutputChunk), exit (ExecResponse), error (ErrorBody)"),
              (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn exec_stream(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Json(body): Json<ExecBody>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let params = body.into_params(&st.manager.caps)?;
    // Fail before the stream starts if the sandbox is not there, so the
    // caller gets a proper status code.
    st.manager.get(&id)?;
    let (tx, rx) = mpsc::channel::<ExecEvent>(16);
    let manager = st.manager.clone();
    let task = tokio::spawn(async move { manager.exec(&id, params, Sink::Stream(tx)).await });
    let output = ReceiverStream::new(rx).filter_map(|ev| async move {
        let (name, data) = match ev {
            ExecEvent::Stdout(d) => ("stdout", d),
            ExecEvent::Stderr(d) => ("stderr", d),
            // Commands have no rich results.
            ExecEvent::Rich(_) => return None,
        };
        let chunk = OutputChunk {
            data: String::from_utf8_lossy(&data).into_owned(),
        };
        Some(Ok(Event::default()
            .event(name)
            .json_data(chunk)
            .unwrap_or_default()))
    });
    let last = stream::once(async move {
        let ev = match task.await {
            Ok(Ok(out)) => Event::default()
                .event("exit")
                .json_data(ExecResponse::from(out)),
            Ok(Err(e)) => Event::default()
                .event("error")
                .json_data(ApiError::from(e).body()),
            Err(e) => Event::default().event("error").json_data(
                ApiError::new(
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    e.to_string(),
                )
                .body(),
            ),
        };
        Ok(ev.unwrap_or_default())
    });
    Ok(Sse::new(output.chain(last)).keep_alive(KeepAlive::default()))
}
