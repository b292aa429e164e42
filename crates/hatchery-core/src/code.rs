//! `run_code`: code run in an interpreter that is already running in the
//! sandbox (a context), with the same layered deadlines, caps and
//! accounting as exec (`exec::drive`).

use crate::agent_client::{expect_ok, AgentClient};
use crate::exec::{drive, Sink};
use crate::CoreError;
use hatchery_agent_proto::{
    CodeRequest, CodeResult, ContextInfo, ContextRequest, EndReason, Frame, Kind,
};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Languages the API accepts; whether a sandbox has an interpreter for one
/// is the guest's answer.
pub const LANGUAGES: &[&str] = &["python"];

#[derive(Debug, Clone)]
pub struct CodeParams {
    pub language: String,
    pub context: Option<String>,
    pub code: String,
    pub env: BTreeMap<String, String>,
    pub timeout: Duration,
    pub cpu_limit_ms: Option<u64>,
    pub max_output_bytes: u64,
    /// Where the default context goes before this run if nothing has
    /// placed it yet (created if missing; see the agent's `CodeRequest`).
    pub initial_cwd: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub struct CodeOutcome {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Rich results (`type` = `result`), in order.
    pub results: Vec<serde_json::Value>,
    /// The cell's exception, if it raised (`type` = `error`).
    pub error: Option<serde_json::Value>,
    pub context: String,
    pub execution_count: u64,
    pub reason: EndReason,
    pub truncated: bool,
    pub duration_ms: u64,
    pub cpu_ms: u64,
    pub memory_peak_bytes: Option<u64>,
    pub restarted: bool,
    pub oom_killed: bool,
}

impl CodeOutcome {
    /// Sorts the kernel's rich events into results and the error.
    pub fn absorb(&mut self, rich: Vec<serde_json::Value>) {
        for v in rich {
            if v["type"] == "error" {
                self.error = Some(v);
            } else {
                self.results.push(v);
            }
        }
    }
}

pub async fn run(
    client: &AgentClient,
    p: CodeParams,
    sink: Sink,
) -> Result<CodeOutcome, CoreError> {
    let start = Instant::now();
    let req = CodeRequest {
        context: p.context,
        language: p.language,
        code: p.code,
        env: p.env,
        timeout_ms: p.timeout.as_millis() as u64,
        cpu_limit_ms: p.cpu_limit_ms,
        max_output_bytes: p.max_output_bytes,
        warm: false,
        initial_cwd: p.initial_cwd,
    };
    let limits = (p.timeout, p.max_output_bytes);
    let (got, r, host_killed) =
        drive::<_, CodeResult>(client, Kind::CodeRun, &req, Kind::CodeDone, limits, sink)
            .await
            .map_err(map_guest)?;
    let mut out = CodeOutcome {
        stdout: got.stdout,
        stderr: got.stderr,
        context: r.context,
        execution_count: r.execution_count,
        reason: if host_killed && r.reason != EndReason::Timeout {
            EndReason::Timeout
        } else {
            r.reason
        },
        truncated: got.truncated || r.truncated,
        duration_ms: start.elapsed().as_millis() as u64,
        cpu_ms: r.cpu_ms,
        memory_peak_bytes: r.memory_peak_bytes,
        restarted: r.restarted,
        ..Default::default()
    };
    out.absorb(got.rich);
    Ok(out)
}

/// Runs the agent's own warm-up cell in the default context (no user code;
/// the context's namespace and execution count stay as they were).
pub async fn warm(client: &AgentClient) {
    let req = CodeRequest {
        context: None,
        language: "python".into(),
        code: String::new(),
        env: BTreeMap::new(),
        timeout_ms: 10_000,
        cpu_limit_ms: None,
        max_output_bytes: 4096,
        warm: true,
        initial_cwd: None,
    };
    let limits = (Duration::from_secs(10), 4096);
    let _ = drive::<_, CodeResult>(
        client,
        Kind::CodeRun,
        &req,
        Kind::CodeDone,
        limits,
        Sink::Collect,
    )
    .await;
}

fn map_guest(e: CoreError) -> CoreError {
    match e {
        CoreError::Guest { code, message } => match code.as_str() {
            "not_found" => CoreError::ContextNotFound(message),
            "invalid" => CoreError::Invalid(message),
            "too_many" => CoreError::Conflict(message),
            _ => CoreError::Guest { code, message },
        },
        other => other,
    }
}

async fn call(client: &AgentClient, kind: Kind, req: &ContextRequest) -> Result<Frame, CoreError> {
    let mut ch = client.open();
    client
        .send(&Frame::json(ch.id, kind, req))
        .await
        .map_err(|e| CoreError::GuestUnresponsive(e.to_string()))?;
    // Starting an interpreter takes a fraction of a second; a guest that
    // says nothing for this long is not going to.
    match tokio::time::timeout(Duration::from_secs(30), expect_ok(&mut ch)).await {
        Ok(r) => r.map_err(map_guest),
        Err(_) => Err(CoreError::GuestUnresponsive(
            "no answer about the context".into(),
        )),
    }
}

fn parse<T: serde::de::DeserializeOwned>(f: &Frame) -> Result<T, CoreError> {
    f.parse()
        .map_err(|e| CoreError::GuestUnresponsive(format!("bad context reply: {e}")))
}

/// `make_cwd`: create `cwd` if it is missing rather than refuse.
pub async fn create_context(
    client: &AgentClient,
    language: &str,
    cwd: Option<String>,
    make_cwd: bool,
) -> Result<ContextInfo, CoreError> {
    let req = ContextRequest {
        id: None,
        language: Some(language.to_string()),
        cwd,
        make_cwd,
    };
    parse(&call(client, Kind::ContextCreate, &req).await?)
}

pub async fn list_contexts(client: &AgentClient) -> Result<Vec<ContextInfo>, CoreError> {
    let req = ContextRequest {
        id: None,
        language: None,
        cwd: None,
        make_cwd: false,
    };
    let mut all: Vec<ContextInfo> = parse(&call(client, Kind::ContextList, &req).await?)?;
    all.truncate(64);
    Ok(all)
}

pub async fn restart_context(client: &AgentClient, id: &str) -> Result<ContextInfo, CoreError> {
    let req = ContextRequest {
        id: Some(id.to_string()),
        language: None,
        cwd: None,
        make_cwd: false,
    };
    parse(&call(client, Kind::ContextRestart, &req).await?)
}

pub async fn delete_context(client: &AgentClient, id: &str) -> Result<(), CoreError> {
    let req = ContextRequest {
        id: Some(id.to_string()),
        language: None,
        cwd: None,
        make_cwd: false,
    };
    call(client, Kind::ContextDelete, &req).await.map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rich_events_are_sorted_into_results_and_error() {
        let mut o = CodeOutcome::default();
        o.absorb(vec![
            json!({"type": "result", "data": {"text/plain": "1"}}),
            json!({"type": "error", "name": "ValueError"}),
            json!({"type": "result", "data": {"text/plain": "2"}}),
        ]);
        assert_eq!(o.results.len(), 2);
        assert_eq!(o.error.unwrap()["name"], "ValueError");
    }

    #[test]
    fn guest_codes_map_to_core_errors() {
        let g = |c: &str| CoreError::Guest {
            code: c.into(),
            message: "m".into(),
        };
        assert!(matches!(
            map_guest(g("not_found")),
            CoreError::ContextNotFound(_)
        ));
        assert!(matches!(map_guest(g("invalid")), CoreError::Invalid(_)));
        assert!(matches!(map_guest(g("too_many")), CoreError::Conflict(_)));
        assert!(matches!(map_guest(g("io")), CoreError::Guest { .. }));
    }
}
