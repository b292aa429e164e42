//! One call's exchange with the upstream, after its reservation: sent, its
//! answer read to the end (whole, or passed on as it streams) and settled.
//!
//! It runs in a task of its own, so a caller that hangs up does not cancel
//! it: the gateway keeps reading the upstream's answer (which the upstream
//! bills whether anyone reads it or not) and settles what it reports. The
//! whole exchange has a deadline shorter than the reservation's TTL
//! (`settle::answer_deadline`); when the answer does not end by then, or
//! breaks off, its usage is not known and the whole reservation is charged.

use crate::errors::CallError;
use crate::events::GatewayEvent;
use crate::settle::Settle;
use crate::upstream::{Upstream, UpstreamError};
use crate::usage::{Reported, SseData, Usage};
use axum::body::Body;
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use serde_json::Value;
use std::time::Duration;
use tokio::time::{timeout_at, Instant};

/// Largest non-streamed upstream answer passed on.
const MAX_ANSWER: usize = 16 << 20;

/// What to send upstream, and by when its answer must have ended.
pub struct Exchange {
    pub upstream: Upstream,
    pub path: &'static str,
    pub body: Bytes,
    pub headers: Vec<(&'static str, String)>,
    pub stream: bool,
    pub deadline: Instant,
    /// The deadline as a duration, for the error that names it.
    pub within: Duration,
}

/// Runs `x` in its own task and answers the caller; the task settles
/// `settle` whether or not the caller is still there to read the answer.
pub async fn run(settle: Settle, x: Exchange) -> Response {
    let flavor = settle.flavor();
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        exchange(settle, x, tx).await;
    });
    match rx.await {
        Ok(r) => r,
        // The task ended without answering: it panicked, and its `Settle`
        // charged the whole reservation as it was dropped.
        Err(_) => CallError::BadUpstreamAnswer.into_response(flavor),
    }
}

type Answer = tokio::sync::oneshot::Sender<Response>;

/// A refusal after the reservation: counted, recorded, answered (if the
/// caller still listens) and settled with `used`.
async fn refuse(settle: Settle, tx: Answer, e: CallError, used: Option<Reported>) {
    let flavor = settle.flavor();
    if let Some(g) = settle.gateway() {
        g.metrics.call(flavor, e.outcome());
        g.events.record(GatewayEvent::Refused {
            caller: settle.caller().cloned(),
            flavor,
            code: e.code(),
            message: e.to_string(),
        });
    }
    // Settled before the answer: a caller that reads its budget right after
    // the refusal sees the reservation gone (read-your-writes).
    settle.finish(used).await;
    let _ = tx.send(e.into_response(flavor));
}

async fn exchange(settle: Settle, x: Exchange, tx: Answer) {
    let flavor = settle.flavor();
    let head = timeout_at(
        x.deadline,
        x.upstream.post(x.path, x.body.clone(), &x.headers),
    )
    .await;
    let answer = match head {
        Ok(Ok(a)) => a,
        // Refused before the request was out: nothing was generated.
        Ok(Err(
            e @ (UpstreamError::Connect { .. }
            | UpstreamError::Tls { .. }
            | UpstreamError::BadUrl(_)
            | UpstreamError::Ca(_)),
        )) => {
            return refuse(
                settle,
                tx,
                CallError::Upstream(e),
                Some(Reported::nothing()),
            )
            .await
        }
        // Sent, and then no answer (or a broken one): the upstream may be
        // generating all the same; its usage is not known.
        Ok(Err(e)) => return refuse(settle, tx, CallError::Upstream(e), None).await,
        Err(_) => return refuse(settle, tx, CallError::AnswerDeadline(x.within), None).await,
    };
    let status = answer.status();
    let content_type = answer.headers().get("content-type").cloned();
    if x.stream && status.is_success() {
        return stream_through(
            settle,
            x.deadline,
            x.within,
            status,
            content_type,
            answer,
            tx,
        )
        .await;
    }
    let bytes = match timeout_at(
        x.deadline,
        Limited::new(answer.into_body(), MAX_ANSWER).collect(),
    )
    .await
    {
        Ok(Ok(b)) => b.to_bytes(),
        Ok(Err(_)) => return refuse(settle, tx, CallError::BadUpstreamAnswer, None).await,
        Err(_) => return refuse(settle, tx, CallError::AnswerDeadline(x.within), None).await,
    };
    let usage = serde_json::from_slice::<Value>(&bytes)
        .map(|v| Usage::of_body(flavor, &v))
        .unwrap_or_default();
    // An upstream error generated nothing unless it says otherwise.
    let used = usage
        .complete()
        .or((!status.is_success()).then(Reported::nothing));
    let outcome = if status.is_success() {
        "ok"
    } else {
        "upstream_error"
    };
    if let Some(g) = settle.gateway() {
        g.metrics.call(flavor, outcome);
    }
    // Settled before the answer (one store write): a caller that reads its
    // budget right after the call sees the charge, not the reservation.
    settle.finish(used).await;
    let _ = tx.send(respond(status, content_type, Body::from(bytes)));
}

/// How a streamed answer ended.
#[derive(Debug, PartialEq)]
enum End {
    /// The upstream finished it.
    Clean,
    /// It broke off (an error mid-body).
    Broken,
    /// It did not end by the deadline.
    Late,
}

/// Passes the upstream's stream on as it arrives, reading usage out of it
/// on the way; after the caller goes away it goes on reading (for the
/// usage), until the end or the deadline, and settles.
async fn stream_through(
    settle: Settle,
    deadline: Instant,
    within: Duration,
    status: StatusCode,
    content_type: Option<HeaderValue>,
    answer: hyper::Response<hyper::body::Incoming>,
    tx: Answer,
) {
    let flavor = settle.flavor();
    let mut body = answer.into_body();
    let (out, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(16);
    let body_out = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    let mut gone = tx.send(respond(status, content_type, body_out)).is_err();
    let (mut sse, mut usage) = (SseData::default(), Usage::default());
    let end = loop {
        match timeout_at(deadline, body.frame()).await {
            Ok(Some(Ok(f))) => {
                let Ok(data) = f.into_data() else { continue };
                sse.push(&data, |d| usage.feed_event(flavor, d));
                // A caller that stops reading holds the stream no longer
                // than the deadline.
                if !gone {
                    match timeout_at(deadline, out.send(Ok(data))).await {
                        Ok(Ok(())) => {}
                        Ok(Err(_)) => gone = true,
                        Err(_) => break End::Late,
                    }
                }
            }
            Ok(Some(Err(e))) => {
                let _ = out.try_send(Err(std::io::Error::other(e.to_string())));
                break End::Broken;
            }
            Ok(None) => break End::Clean,
            Err(_) => {
                let _ = out.try_send(Err(std::io::Error::other(format!(
                    "the upstream did not finish its answer within {within:?}"
                ))));
                break End::Late;
            }
        }
    };
    let outcome = match (&end, gone) {
        (End::Clean, false) => "ok",
        (End::Clean, true) => "caller_gone",
        (End::Broken, _) => "interrupted",
        (End::Late, _) => "deadline",
    };
    if let Some(g) = settle.gateway() {
        g.metrics.call(flavor, outcome);
    }
    // Only a finished stream's report is its usage (a broken one's is
    // partial: Anthropic's first event already names an output of 1);
    // without it the worst case is what it cost.
    let used = if end == End::Clean {
        usage.complete()
    } else {
        None
    };
    settle.finish(used).await;
    // The caller's stream ends only now, after the settle, so a budget read
    // once the stream is done already shows the charge.
    drop(out);
}

pub(crate) fn respond(
    status: StatusCode,
    content_type: Option<HeaderValue>,
    body: Body,
) -> Response {
    let mut r = Response::new(body);
    *r.status_mut() = status;
    if let Some(ct) = content_type {
        r.headers_mut().insert("content-type", ct);
    }
    r
}
