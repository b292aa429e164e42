use crate::error::ErrorBody;
use crate::extract::Json;
use crate::models::{ExecBody, ExecResponse, OutputChunk};
use crate::output::{OutputEncoding, Utf8Carry};
use crate::process_models::ProcessInfo;
use crate::{ApiError, AppState};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::stream::{self, Stream, StreamExt};
use hatchery_core::exec::{ExecEvent, Sink};
use std::convert::Infallible;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

#[utoipa::path(post, path = "/v1/sandboxes/{id}/exec", tag = "exec", params(("id" = String, Path)),
    request_body = ExecBody,
    responses((status = 200, body = ExecResponse), (status = 202, body = ProcessInfo, description = "background: started"),
              (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody), (status = 429, body = ErrorBody, description = "too many background processes"),
              (status = 504, body = ErrorBody)))]
pub async fn exec(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Json(body): Json<ExecBody>,
) -> Result<Response, ApiError> {
    let (background, enc) = (body.background, body.output);
    let timeout_given = body.timeout_seconds.is_some();
    let params = body.into_params(&st.manager.caps)?;
    if background {
        if params.cpu_basis != hatchery_core::exec::CpuBasis::Guest {
            return Err(ApiError::bad_request(
                "cpu_limit_basis \"host\" is for commands waited on, not background processes",
            ));
        }
        let timeout = timeout_given.then_some(params.timeout);
        let info = st.manager.start_process(&id, params, timeout).await?;
        let info: ProcessInfo = info.into();
        return Ok((StatusCode::ACCEPTED, axum::Json(info)).into_response());
    }
    let out = st.manager.exec(&id, params, Sink::Collect).await?;
    Ok(axum::Json(ExecResponse::encoded(out, enc)).into_response())
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
    if body.background {
        return Err(ApiError::bad_request("a background process is started with POST /exec; read its output from /processes/{pid}/output"));
    }
    let enc = body.output;
    let params = body.into_params(&st.manager.caps)?;
    // Fail before the stream starts if the sandbox is not there, so the
    // caller gets a proper status code.
    st.manager.get(&id).await?;
    let (tx, rx) = mpsc::channel::<ExecEvent>(16);
    let manager = st.manager.clone();
    let task = tokio::spawn(async move { manager.exec(&id, params, Sink::Stream(tx)).await });
    let mut carry = (Utf8Carry::default(), Utf8Carry::default());
    let output = ReceiverStream::new(rx).filter_map(move |ev| {
        let item = match ev {
            ExecEvent::Stdout(d) => Some(("stdout", encode(enc, &mut carry.0, &d))),
            ExecEvent::Stderr(d) => Some(("stderr", encode(enc, &mut carry.1, &d))),
            // Commands have no rich results.
            ExecEvent::Rich(_) => None,
        };
        async move { chunk_event(item?) }
    });

    let last = stream::once(async move {
        let ev = match task.await {
            Ok(Ok(out)) => Event::default()
                .event("exit")
                .json_data(ExecResponse::encoded(out, enc)),
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

/// One chunk of a stream as JSON: text with split characters held back, or
/// base64. An empty text chunk (all held back) sends nothing.
pub(crate) fn encode(enc: OutputEncoding, carry: &mut Utf8Carry, data: &[u8]) -> String {
    match enc {
        OutputEncoding::Text => carry.push(data),
        OutputEncoding::Base64 => enc.whole(data),
    }
}

fn chunk_event((name, data): (&'static str, String)) -> Option<Result<Event, Infallible>> {
    if data.is_empty() {
        return None;
    }
    Some(Ok(Event::default()
        .event(name)
        .json_data(OutputChunk { data })
        .unwrap_or_default()))
}
