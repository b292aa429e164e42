//! `run_code` and interpreter contexts.

use crate::code_models::*;
use crate::error::ErrorBody;
use crate::extract::Json;
use crate::models::OutputChunk;
use crate::{ApiError, AppState};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::stream::{self, Stream, StreamExt};
use hatchery_core::exec::{ExecEvent, Sink};
use std::convert::Infallible;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

#[utoipa::path(post, path = "/v1/sandboxes/{id}/code", tag = "code", params(("id" = String, Path)),
    request_body = CodeBody,
    responses((status = 200, body = CodeResponse), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody), (status = 413, body = ErrorBody), (status = 504, body = ErrorBody)))]
pub async fn run(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Json(body): Json<CodeBody>,
) -> Result<axum::Json<CodeResponse>, ApiError> {
    let params = body.into_params(&st.manager.caps)?;
    let out = st.manager.run_code(&id, params, Sink::Collect).await?;
    Ok(axum::Json(out.into()))
}

/// Server-sent events as the cell runs: `stdout` and `stderr`
/// (`{"data": "..."}`), `result` (a rich result), `error` (the cell's
/// exception), then exactly one `done` (the run's accounting), or one
/// `failed` with the usual error body. Closing the connection cancels the
/// run (the context is restarted).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/code/stream", tag = "code", params(("id" = String, Path)),
    request_body = CodeBody,
    responses((status = 200, content_type = "text/event-stream", body = CodeSummary,
               description = "events: stdout, stderr (OutputChunk), result (CodeResultItem), error (CodeError), done (CodeSummary), failed (ErrorBody)"),
              (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 413, body = ErrorBody)))]
pub async fn stream(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Json(body): Json<CodeBody>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let params = body.into_params(&st.manager.caps)?;
    st.manager.get(&id).await?;
    let (tx, rx) = mpsc::channel::<ExecEvent>(16);
    let manager = st.manager.clone();
    let task = tokio::spawn(async move { manager.run_code(&id, params, Sink::Stream(tx)).await });
    let output = ReceiverStream::new(rx).map(|ev| {
        let ev = match ev {
            ExecEvent::Stdout(d) => Event::default().event("stdout").json_data(OutputChunk {
                data: String::from_utf8_lossy(&d).into_owned(),
            }),
            ExecEvent::Stderr(d) => Event::default().event("stderr").json_data(OutputChunk {
                data: String::from_utf8_lossy(&d).into_owned(),
            }),
            ExecEvent::Rich(v) if v["type"] == "error" => {
                Event::default().event("error").json_data(error_item(&v))
            }
            ExecEvent::Rich(v) => Event::default().event("result").json_data(result_item(&v)),
        };
        Ok(ev.unwrap_or_default())
    });
    let last = stream::once(async move {
        let ev = match task.await {
            Ok(Ok(out)) => Event::default()
                .event("done")
                .json_data(CodeSummary::from(&out)),
            Ok(Err(e)) => Event::default()
                .event("failed")
                .json_data(ApiError::from(e).body()),
            Err(e) => Event::default().event("failed").json_data(
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()).body(),
            ),
        };
        Ok(ev.unwrap_or_default())
    });
    Ok(Sse::new(output.chain(last)).keep_alive(KeepAlive::default()))
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/code/contexts", tag = "code", params(("id" = String, Path)),
    request_body = CreateContext,
    responses((status = 201, body = CodeContext), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody, description = "at most 16 contexts per sandbox")))]
pub async fn create_context(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Json(body): Json<CreateContext>,
) -> Result<(StatusCode, axum::Json<CodeContext>), ApiError> {
    let language = body.language.unwrap_or_else(|| "python".into());
    if !hatchery_core::code::LANGUAGES.contains(&language.as_str()) {
        return Err(ApiError::bad_request(format!(
            "unknown language {language:?}"
        )));
    }
    let c = st
        .manager
        .create_context(&id, &language, body.cwd, false)
        .await?;
    Ok((StatusCode::CREATED, axum::Json(c.into())))
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/code/contexts", tag = "code", params(("id" = String, Path)),
    responses((status = 200, body = CodeContextList), (status = 404, body = ErrorBody)))]
pub async fn list_contexts(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<axum::Json<CodeContextList>, ApiError> {
    let all = st.manager.list_contexts(&id).await?;
    Ok(axum::Json(CodeContextList {
        contexts: all.into_iter().map(Into::into).collect(),
    }))
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/code/contexts/{context_id}/restart", tag = "code",
    params(("id" = String, Path), ("context_id" = String, Path)),
    responses((status = 200, body = CodeContext), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn restart_context(
    State(st): State<AppState>,
    Path((id, ctx)): Path<(String, String)>,
) -> Result<axum::Json<CodeContext>, ApiError> {
    validate_context_id(&ctx)?;
    Ok(axum::Json(
        st.manager.restart_context(&id, &ctx).await?.into(),
    ))
}

#[utoipa::path(delete, path = "/v1/sandboxes/{id}/code/contexts/{context_id}", tag = "code",
    params(("id" = String, Path), ("context_id" = String, Path)),
    responses((status = 204), (status = 400, body = ErrorBody, description = "the default context cannot be deleted"),
              (status = 404, body = ErrorBody)))]
pub async fn delete_context(
    State(st): State<AppState>,
    Path((id, ctx)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    validate_context_id(&ctx)?;
    st.manager.delete_context(&id, &ctx).await?;
    Ok(StatusCode::NO_CONTENT)
}
