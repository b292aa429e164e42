//! The code interpreter (port 49999) of `e2b-code-interpreter`:
//! `POST /execute` answers newline-delimited JSON (`stdout`, `stderr`,
//! `result` with MIME keys, `error`, `number_of_executions`,
//! `end_of_execution`) from Hatchery's `run_code`; `/contexts` are
//! Hatchery's code contexts.
//!
//! As E2B's server: contexts start in `/home/user` unless told otherwise
//! (the default context moves there before its first run from here), a
//! silent run writes a `keepalive` line every [`KEEPALIVE`] so a client
//! that went away is noticed (and its run stopped) without waiting for
//! output, and a run whose sandbox dies drops the connection.

use crate::api_error::{ApiError, Body};
use crate::backend::{BResult, CodeDone, CodeEvent, CodeSpec, FailKind};
use crate::sandbox::{Target, INTERPRETER_PORT};
use crate::sever::Sever;
use crate::state::Shared;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Longest run: E2B's SDK bounds it on the client (default 300 s);
/// Hatchery's `run_code` allows an hour.
const MAX_RUN: Duration = Duration::from_secs(3600);
pub const MAX_CODE_BYTES: usize = 256 * 1024;
/// The working directory of E2B's contexts (its template's user's home).
pub const E2B_HOME: &str = "/home/user";
/// A closed connection is only noticed when written to: E2B's server
/// writes `{"type": "keepalive"}` every 5 s for that (the SDKs skip the
/// line); sooner here, so a run the client gave up on stops sooner.
const KEEPALIVE: Duration = Duration::from_secs(1);

fn port_check(t: &Target) -> Result<(), Box<Response>> {
    if t.port != INTERPRETER_PORT {
        return Err(Box::new(crate::sandbox::wrong_port(t)));
    }
    Ok(())
}

#[derive(Deserialize)]
pub struct ExecuteBody {
    code: String,
    context_id: Option<String>,
    language: Option<String>,
    #[serde(default)]
    env_vars: Option<BTreeMap<String, String>>,
}

/// The kernel a request's language names (E2B's names, case-insensitive).
/// Whether the sandbox has an interpreter for it is the agent's answer
/// (400 with the reason when its template has none).
fn kernel_of(l: Option<&str>) -> Result<&'static str, ApiError> {
    let l = l.map(|l| l.trim().to_ascii_lowercase());
    match l.as_deref() {
        None | Some("") | Some("python") | Some("python3") => Ok("python"),
        Some("bash") => Ok("bash"),
        Some("js") | Some("javascript") => Ok("javascript"),
        Some("ts") | Some("typescript") => Ok("typescript"),
        Some("r") => Ok("r"),
        Some("java") => Ok("java"),
        Some(other) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "language {other:?} is not supported by Hatchery's code interpreter \
                 (python, bash, js, ts, r and java are)"
            ),
        )),
    }
}

/// How long `/execute`, for a language other than Python, holds its answer
/// until the run's first event or its end, to learn whether the sandbox
/// can run it before it commits to a 200 stream. The agent refuses a
/// language it has no interpreter for at once, and gives up on a kernel
/// that does not get ready within its own 20 s (kernel.rs READY_TIMEOUT):
/// both are a 400 with the reason, never a stream that hangs or ends in an
/// error. A started kernel answers within that time with the cell's first
/// output, or the cell is quiet and the stream starts when this runs out
/// (under the JS SDK's 30 s wait for an answer's head).
const REFUSAL_WAIT: Duration = Duration::from_secs(25);

fn now() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// A result's text as E2B's server gives it: a repr in quotes (a string's,
/// `'bar'`) loses them, so `os.getenv("FOO")` reads `bar`. Hatchery's own
/// API keeps the repr.
fn unquoted(val: &Value) -> Value {
    match val.as_str() {
        Some(s)
            if s.len() >= 2
                && ((s.starts_with('\'') && s.ends_with('\''))
                    || (s.starts_with('"') && s.ends_with('"'))) =>
        {
            json!(s[1..s.len() - 1])
        }
        _ => val.clone(),
    }
}

/// MIME bundle keys as the SDK names them.
fn result_line(v: &Value) -> Value {
    let mut out = Map::new();
    out.insert("type".into(), json!("result"));
    let mut extra = Map::new();
    if let Some(data) = v["data"].as_object() {
        for (mime, val) in data {
            let key = match mime.as_str() {
                "text/plain" => {
                    out.insert("text".into(), unquoted(val));
                    continue;
                }
                "text/html" => "html",
                "text/markdown" => "markdown",
                "image/svg+xml" => "svg",
                "image/png" => "png",
                "image/jpeg" => "jpeg",
                "application/pdf" => "pdf",
                "text/latex" => "latex",
                "application/json" => "json",
                "application/javascript" => "javascript",
                "e2b/data" => "data",
                "e2b/chart" => "chart",
                _ => {
                    extra.insert(mime.clone(), val.clone());
                    continue;
                }
            };
            out.insert(key.into(), val.clone());
        }
    }
    if !extra.is_empty() {
        out.insert("extra".into(), Value::Object(extra));
    }
    out.insert(
        "is_main_result".into(),
        json!(v["is_main_result"].as_bool().unwrap_or(false)),
    );
    Value::Object(out)
}

fn error_line(v: &Value) -> Value {
    let tb = match &v["traceback"] {
        Value::String(s) => s.clone(),
        Value::Array(a) => a
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    };
    json!({"type": "error", "name": v["name"].as_str().unwrap_or("Error"),
           "value": v["value"].as_str().map(str::to_string).unwrap_or_else(|| v["value"].to_string()),
           "traceback": tb})
}

fn line(v: &Value) -> Bytes {
    let mut b = serde_json::to_vec(v).expect("json values serialize");
    b.push(b'\n');
    b.into()
}

/// A run's end that refuses the request (a 400 with the agent's reason):
/// a language the sandbox has no interpreter for, or a kernel that could
/// not start (`spawn_failed`, its reason from the kernel's stderr).
fn refusal(res: &Result<BResult<CodeDone>, tokio::task::JoinError>) -> Option<ApiError> {
    match res {
        Ok(Err(e)) if e.kind == FailKind::Invalid => {
            Some(ApiError::new(StatusCode::BAD_REQUEST, e.message.clone()))
        }
        _ => None,
    }
}

pub async fn execute(
    State(s): State<Arc<Shared>>,
    Extension(t): Extension<Target>,
    Body(b): Body<ExecuteBody>,
) -> Response {
    if let Err(r) = port_check(&t) {
        return *r;
    }
    if b.language.is_some() && b.context_id.is_some() {
        return ApiError::new(
            StatusCode::BAD_REQUEST,
            "give context_id or language, not both",
        )
        .into_response();
    }
    let kernel = match kernel_of(b.language.as_deref()) {
        Ok(k) => k,
        Err(e) => return e.into_response(),
    };
    if b.code.len() > MAX_CODE_BYTES {
        return ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("code over {MAX_CODE_BYTES} bytes"),
        )
        .into_response();
    }
    let context = b.context_id.filter(|c| !c.is_empty());
    let spec = CodeSpec {
        initial_cwd: context.is_none().then(|| E2B_HOME.to_string()),
        language: if context.is_some() { "" } else { kernel }.to_string(),
        code: b.code,
        context,
        env: b.env_vars.unwrap_or_default(),
        timeout: MAX_RUN,
    };
    let (tx, rx) = mpsc::channel::<Bytes>(32);
    let sever = Sever::default();
    let cut = sever.clone();
    let (etx, mut erx) = mpsc::channel::<CodeEvent>(32);
    let backend = Arc::clone(&s.backend);
    let sandbox = t.sandbox.clone();
    let refusable = spec.context.is_none() && kernel != "python";
    // Not aborted when the client goes away: dropping the events receiver
    // makes the backend stop the run in the sandbox, which dropping the
    // run's future would not.
    let mut run = tokio::spawn(async move { backend.run_code(&sandbox, spec, etx).await });
    // A language whose interpreter the template lacks (JavaScript without
    // Node) is a 400 with the agent's reason, as a create_context of it
    // is, not a stream that ends in an error.
    let mut first: Option<CodeEvent> = None;
    let mut ended = None;
    if refusable {
        // The events channel closes when the run ends, at the same time
        // as `run` is ready: a closed channel is no first event but the
        // end, whose answer decides (choosing at random between the two
        // made a refusal a 200 stream half of the time).
        let res = tokio::select! {
            biased;
            res = &mut run => Some(res),
            ev = erx.recv() => match ev {
                Some(ev) => {
                    first = Some(ev);
                    None
                }
                None => Some((&mut run).await),
            },
            _ = tokio::time::sleep(REFUSAL_WAIT) => None,
        };
        if let Some(res) = res {
            if let Some(refused) = refusal(&res) {
                return refused.into_response();
            }
            ended = Some(res);
        }
    }
    tokio::spawn(async move {
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + KEEPALIVE, KEEPALIVE);
        loop {
            let ev = if let Some(ev) = first.take() {
                Some(ev)
            } else {
                tokio::select! {
                    ev = erx.recv() => ev,
                    _ = tick.tick() => {
                        if tx.send(line(&json!({"type": "keepalive"}))).await.is_err() {
                            return;
                        }
                        continue;
                    }
                    _ = tx.closed() => return,
                }
            };
            let v = match ev {
                Some(CodeEvent::Stdout(b)) => {
                    json!({"type": "stdout", "text": String::from_utf8_lossy(&b), "timestamp": now()})
                }
                Some(CodeEvent::Stderr(b)) => {
                    json!({"type": "stderr", "text": String::from_utf8_lossy(&b), "timestamp": now()})
                }
                Some(CodeEvent::Rich(v)) if v["type"] == "error" => error_line(&v),
                Some(CodeEvent::Rich(v)) => result_line(&v),
                None => break,
            };
            if tx.send(line(&v)).await.is_err() {
                return;
            }
        }
        let res = match ended {
            Some(r) => r,
            None => run.await,
        };
        let failed = !matches!(&res, Ok(Ok(d)) if d.reason == "exited");
        if failed && crate::sever::sandbox_gone(s.backend.as_ref(), &t.sandbox).await {
            // No end_of_execution: the SDK must see the connection drop.
            cut.cut();
            return;
        }
        match res {
            Ok(Ok(done)) => {
                if done.reason != "exited" && done.error.is_none() {
                    let why = match done.reason.as_str() {
                        "timeout" => "the run reached its time limit",
                        "output_limit" => "the run's output reached its limit",
                        _ => "the run was stopped",
                    };
                    let _ = tx.send(line(&json!({"type": "error", "name": "ExecutionStopped", "value": format!("{why} ({}); the context was restarted", done.reason), "traceback": ""}))).await;
                }
                let _ = tx.send(line(&json!({"type": "number_of_executions", "execution_count": done.execution_count}))).await;
            }
            Ok(Err(e)) => {
                let name = if e.kind == FailKind::ContextNotFound {
                    "ContextNotFound"
                } else {
                    "HatcheryError"
                };
                let _ = tx.send(line(&json!({"type": "error", "name": name, "value": e.message, "traceback": ""}))).await;
            }
            Err(_) => {
                let _ = tx.send(line(&json!({"type": "error", "name": "HatcheryError", "value": "the run failed", "traceback": ""}))).await;
            }
        }
        let _ = tx.send(line(&json!({"type": "end_of_execution"}))).await;
    });
    let body = crate::sever::body(tokio_stream::wrappers::ReceiverStream::new(rx), sever);
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        body,
    )
        .into_response()
}

#[derive(Deserialize, Default)]
pub struct NewContext {
    language: Option<String>,
    cwd: Option<String>,
}

fn ctx_json(c: &crate::backend::ContextView) -> Value {
    json!({"id": c.id, "language": c.language, "cwd": c.cwd})
}

pub async fn create_context(
    State(s): State<Arc<Shared>>,
    Extension(t): Extension<Target>,
    Body(b): Body<NewContext>,
) -> Response {
    if let Err(r) = port_check(&t) {
        return *r;
    }
    let res: Result<Response, ApiError> = async {
        let kernel = kernel_of(b.language.as_deref())?;
        // Without a cwd, E2B's home, made if the template has no such
        // user; a cwd given must exist.
        let (cwd, make) = match b.cwd.filter(|c| !c.is_empty()) {
            Some(c) => (c, false),
            None => (E2B_HOME.to_string(), true),
        };
        let c = s
            .backend
            .create_context(&t.sandbox, kernel, cwd, make)
            .await?;
        Ok(Json(ctx_json(&c)).into_response())
    }
    .await;
    res.unwrap_or_else(IntoResponse::into_response)
}

pub async fn list_contexts(
    State(s): State<Arc<Shared>>,
    Extension(t): Extension<Target>,
) -> Response {
    if let Err(r) = port_check(&t) {
        return *r;
    }
    match s.backend.list_contexts(&t.sandbox).await {
        Ok(cs) => Json(cs.iter().map(ctx_json).collect::<Vec<_>>()).into_response(),
        Err(e) => ApiError::from(e).into_response(),
    }
}

pub async fn delete_context(
    State(s): State<Arc<Shared>>,
    Extension(t): Extension<Target>,
    Path(id): Path<String>,
) -> Response {
    if let Err(r) = port_check(&t) {
        return *r;
    }
    match s.backend.delete_context(&t.sandbox, &id).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => ApiError::from(e).into_response(),
    }
}

pub async fn restart_context(
    State(s): State<Arc<Shared>>,
    Extension(t): Extension<Target>,
    Path(id): Path<String>,
) -> Response {
    if let Err(r) = port_check(&t) {
        return *r;
    }
    match s.backend.restart_context(&t.sandbox, &id).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => ApiError::from(e).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_that_ends_invalid_is_refused_with_its_reason() {
        let invalid: Result<BResult<CodeDone>, tokio::task::JoinError> = Ok(Err(
            crate::backend::BackendError::new(FailKind::Invalid, "no javascript interpreter"),
        ));
        let r = refusal(&invalid).expect("refused").into_response();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        // Anything else is the stream's to report (an error line, or the
        // connection cut when the sandbox is gone).
        for kind in [
            FailKind::Internal,
            FailKind::SandboxNotFound,
            FailKind::Unresponsive,
        ] {
            let other: Result<BResult<CodeDone>, tokio::task::JoinError> =
                Ok(Err(crate::backend::BackendError::new(kind, "x")));
            assert!(refusal(&other).is_none(), "{kind:?}");
        }
    }

    #[test]
    fn language_names_as_e2b_sends_them() {
        for (given, kernel) in [
            (None, "python"),
            (Some("Python3"), "python"),
            (Some("bash"), "bash"),
            (Some("js"), "javascript"),
            (Some(" JavaScript "), "javascript"),
            (Some("ts"), "typescript"),
            (Some("typescript"), "typescript"),
            (Some("r"), "r"),
            (Some("R"), "r"),
            (Some("java"), "java"),
        ] {
            assert_eq!(kernel_of(given).ok(), Some(kernel), "{given:?}");
        }
        for refused in ["rust", "kotlin", "deno", "node"] {
            assert!(kernel_of(Some(refused)).is_err(), "{refused}");
        }
    }

    #[test]
    fn mime_keys() {
        let v = json!({"type": "result", "data": {"text/plain": "42", "image/png": "iVBO", "application/x-custom": 1}, "is_main_result": true});
        let r = result_line(&v);
        assert_eq!(r["text"], "42");
        assert_eq!(r["png"], "iVBO");
        assert_eq!(r["extra"]["application/x-custom"], 1);
        assert_eq!(r["is_main_result"], true);
        // E2B's names for its own types, and a string's repr without quotes.
        let v = json!({"data": {"text/plain": "'bar'", "e2b/data": {"a": [1]}, "e2b/chart": {"type": "pie"}}});
        let r = result_line(&v);
        assert_eq!(
            (&r["text"], &r["data"]["a"][0], &r["chart"]["type"]),
            (&json!("bar"), &json!(1), &json!("pie"))
        );
        assert!(r.get("extra").is_none(), "{r}");
        for (repr, text) in [("\"x\"", "x"), ("'", "'"), ("''", ""), ("'a\" ", "'a\" ")] {
            assert_eq!(
                result_line(&json!({"data": {"text/plain": repr}}))["text"],
                text,
                "{repr}"
            );
        }
        let e = error_line(
            &json!({"name": "ZeroDivisionError", "value": "division by zero", "traceback": ["a", "b"]}),
        );
        assert_eq!(e["traceback"], "a\nb");
    }
}
