//! Wire types of `run_code` and its contexts.

use crate::models::{bounded, validate_cpu_limit, validate_env, ExecReason};
use crate::ApiError;
use hatchery_core::code::{CodeOutcome, CodeParams, LANGUAGES};
use hatchery_core::Caps;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;
use utoipa::ToSchema;

/// Largest cell accepted (413 above it).
pub const MAX_CODE_BYTES: usize = 256 * 1024;
/// Default deadline of a code run; the maximum is exec's.
pub const DEFAULT_CODE_TIMEOUT_S: u64 = 30;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CodeBody {
    /// The cell. At most 256 KiB.
    pub code: String,
    /// `python` (default).
    pub language: Option<String>,
    /// A context from `POST /code/contexts`; default: the sandbox's
    /// default context, already running in every sandbox.
    pub context_id: Option<String>,
    /// Deadline in seconds (default 30), enforced from the host.
    pub timeout_seconds: Option<i64>,
    /// CPU time of the interpreter and everything the cell started, after
    /// which all of it is killed and the context restarted.
    pub cpu_limit_ms: Option<i64>,
    /// Per stream, and for the rich results together (default 1 MiB).
    pub max_output_bytes: Option<i64>,
    /// Set in `os.environ` for this run only.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

impl CodeBody {
    pub fn into_params(self, caps: &Caps) -> Result<CodeParams, ApiError> {
        if self.code.len() > MAX_CODE_BYTES {
            return Err(ApiError::new(
                axum::http::StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!("code is over {MAX_CODE_BYTES} bytes"),
            ));
        }
        let language = self.language.unwrap_or_else(|| "python".into());
        if !LANGUAGES.contains(&language.as_str()) {
            return Err(ApiError::bad_request(format!(
                "unknown language {language:?} (known: {})",
                LANGUAGES.join(", ")
            )));
        }
        if let Some(c) = &self.context_id {
            validate_context_id(c)?;
        }
        validate_env(&self.env, caps)?;
        let timeout = bounded(
            self.timeout_seconds,
            DEFAULT_CODE_TIMEOUT_S.min(caps.max_exec_timeout_s),
            caps.max_exec_timeout_s,
            "timeout_seconds",
        )?;
        let cpu_limit_ms = validate_cpu_limit(self.cpu_limit_ms, timeout)?;
        Ok(CodeParams {
            language,
            context: self.context_id,
            code: self.code,
            env: self.env,
            timeout: Duration::from_secs(timeout),
            cpu_limit_ms,
            max_output_bytes: bounded(
                self.max_output_bytes,
                caps.default_output_bytes,
                caps.max_output_bytes,
                "max_output_bytes",
            )?,
            initial_cwd: None,
        })
    }
}

/// Context ids are `default` or `ctx_` + 16 hex digits; anything else
/// cannot name a context and is refused before it reaches the guest.
pub fn validate_context_id(id: &str) -> Result<(), ApiError> {
    let ok = id == "default"
        || id
            .strip_prefix("ctx_")
            .is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()));
    if ok {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!("{id:?} is not a context id")))
    }
}

/// A rich result: a MIME bundle, the way a Jupyter kernel reports display
/// data (`text/plain` always; `text/html`, `image/png` (base64),
/// `image/svg+xml`, `application/json`, ... when the value offers them).
#[derive(Debug, Serialize, ToSchema)]
pub struct CodeResultItem {
    #[schema(value_type = Object)]
    pub data: serde_json::Value,
    /// The value of the cell's last expression (not a `display()`).
    pub is_main_result: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CodeError {
    /// The exception's class name (`InterpreterDied` when the interpreter
    /// itself died).
    pub name: String,
    pub value: String,
    pub traceback: String,
}

/// Accounting of a code run; also the `done` event of the stream.
#[derive(Debug, Serialize, ToSchema)]
pub struct CodeSummary {
    pub context_id: String,
    pub execution_count: u64,
    /// `exited` when the cell ran to its end (with or without an error).
    pub reason: ExecReason,
    pub truncated: bool,
    pub duration_ms: u64,
    /// CPU time of the interpreter and everything it started during the run.
    pub cpu_ms: u64,
    pub memory_peak_bytes: Option<u64>,
    /// The interpreter was replaced by a clean one: its variables are gone.
    pub restarted: bool,
    pub oom_killed: bool,
    pub error: Option<CodeError>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CodeResponse {
    pub stdout: String,
    pub stderr: String,
    pub results: Vec<CodeResultItem>,
    #[serde(flatten)]
    pub summary: CodeSummary,
}

fn error_of(v: &serde_json::Value) -> CodeError {
    let s = |k: &str| v[k].as_str().unwrap_or("").to_string();
    CodeError {
        name: s("name"),
        value: s("value"),
        traceback: s("traceback"),
    }
}

pub fn result_item(v: &serde_json::Value) -> CodeResultItem {
    CodeResultItem {
        data: if v["data"].is_object() {
            v["data"].clone()
        } else {
            serde_json::json!({})
        },
        is_main_result: v["is_main_result"].as_bool().unwrap_or(false),
    }
}

pub fn error_item(v: &serde_json::Value) -> CodeError {
    error_of(v)
}

impl From<&CodeOutcome> for CodeSummary {
    fn from(o: &CodeOutcome) -> Self {
        CodeSummary {
            context_id: o.context.clone(),
            execution_count: o.execution_count,
            reason: o.reason.into(),
            truncated: o.truncated,
            duration_ms: o.duration_ms,
            cpu_ms: o.cpu_ms,
            memory_peak_bytes: o.memory_peak_bytes,
            restarted: o.restarted,
            oom_killed: o.oom_killed,
            error: o.error.as_ref().map(error_of),
        }
    }
}

impl From<CodeOutcome> for CodeResponse {
    fn from(o: CodeOutcome) -> Self {
        CodeResponse {
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
            results: o.results.iter().map(result_item).collect(),
            summary: CodeSummary::from(&o),
        }
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateContext {
    /// `python` (default).
    pub language: Option<String>,
    /// Working directory of the interpreter (default `/workspace`).
    pub cwd: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CodeContext {
    pub id: String,
    pub language: String,
    pub cwd: String,
    /// `ready`, `busy` (a run in progress) or `starting`.
    pub state: String,
    pub execution_count: u64,
}

impl From<hatchery_agent_proto::ContextInfo> for CodeContext {
    fn from(c: hatchery_agent_proto::ContextInfo) -> Self {
        CodeContext {
            id: c.id,
            language: c.language,
            cwd: c.cwd,
            state: c.state,
            execution_count: c.execution_count,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CodeContextList {
    pub contexts: Vec<CodeContext>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(v: serde_json::Value) -> Result<CodeParams, ApiError> {
        serde_json::from_value::<CodeBody>(v)
            .unwrap()
            .into_params(&Caps::default())
    }

    #[test]
    fn bounds_at_the_edges() {
        let ok = params(serde_json::json!({"code": "x".repeat(MAX_CODE_BYTES)})).unwrap();
        assert_eq!(ok.timeout, Duration::from_secs(30));
        assert_eq!(ok.language, "python");
        let e = params(serde_json::json!({"code": "x".repeat(MAX_CODE_BYTES + 1)})).unwrap_err();
        assert_eq!(e.status, axum::http::StatusCode::PAYLOAD_TOO_LARGE);
        assert!(params(serde_json::json!({"code": "1", "language": "cobol"})).is_err());
        assert!(params(serde_json::json!({"code": "1", "context_id": "../x"})).is_err());
        assert!(
            params(serde_json::json!({"code": "1", "context_id": "ctx_0123456789abcdef"})).is_ok()
        );
        assert!(params(
            serde_json::json!({"code": "1", "timeout_seconds": 2, "cpu_limit_ms": 2001})
        )
        .is_err());
        assert!(params(
            serde_json::json!({"code": "1", "timeout_seconds": 2, "cpu_limit_ms": 2000})
        )
        .is_ok());
        assert!(params(serde_json::json!({"code": "1", "cpu_limit_ms": 0})).is_err());
    }
}
