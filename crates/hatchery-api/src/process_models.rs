//! Wire types of background processes.

use crate::models::ExecReason;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

#[derive(Debug, Serialize, ToSchema)]
pub struct ProcessInfo {
    /// `proc_` + 16 hex digits; names the process in this sandbox only.
    pub id: String,
    /// Its pid inside the sandbox.
    pub pid: i32,
    pub argv: Vec<String>,
    /// RFC 3339.
    pub started_at: String,
    /// `running` or `exited`.
    pub state: String,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub reason: Option<ExecReason>,
    /// Memory ended it: it failed (not exit 0, not its deadline) with an
    /// OOM kill counted in the sandbox since it started, and no SIGKILL
    /// sent through the API (`reason` is then `oom`).
    pub oom_killed: bool,
    /// CPU time of the process and everything it started.
    pub cpu_ms: u64,
    /// Output so far, stdout and stderr together (one offset space).
    pub output_bytes: u64,
    /// Oldest offset still kept (the ring holds the last 1 MiB).
    pub first_offset: u64,
    pub stdin_open: bool,
}

impl From<hatchery_agent_proto::ProcInfo> for ProcessInfo {
    fn from(p: hatchery_agent_proto::ProcInfo) -> Self {
        ProcessInfo {
            id: p.id,
            pid: p.pid,
            argv: p.argv,
            started_at: hatchery_core::rfc3339(p.started_at_ms),
            state: if p.running { "running" } else { "exited" }.into(),
            exit_code: p.exit_code,
            signal: p.signal,
            oom_killed: p.reason == Some(hatchery_agent_proto::EndReason::Oom),
            reason: p.reason.map(Into::into),
            cpu_ms: p.cpu_ms,
            output_bytes: p.output_bytes,
            first_offset: p.first_offset,
            stdin_open: p.stdin_open,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ProcessList {
    pub processes: Vec<ProcessInfo>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct OutputQuery {
    /// First byte wanted (default 0: everything still in the ring).
    pub offset: Option<u64>,
    /// Keep streaming until the process exits (default true).
    pub follow: Option<bool>,
    /// `text` (default) or `base64`.
    pub encoding: Option<crate::output::OutputEncoding>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct WaitQuery {
    /// How long to wait for the exit (default 30, at most 300).
    pub timeout_seconds: Option<i64>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignalBody {
    /// A name (`SIGTERM`, `TERM`) or number from: HUP INT QUIT KILL USR1
    /// USR2 TERM CONT STOP WINCH. Sent to the process's group.
    #[schema(value_type = Object)]
    pub signal: serde_json::Value,
}

/// Payload of a process output event.
#[derive(Debug, Serialize, ToSchema)]
pub struct ProcessChunk {
    pub data: String,
    /// Offset of this chunk's first byte in the process's output.
    pub offset: u64,
}

pub fn parse_signal(v: &serde_json::Value) -> Option<i32> {
    use hatchery_core::procs::SIGNALS;
    match v {
        serde_json::Value::Number(n) => {
            let n = n.as_i64()?;
            SIGNALS
                .iter()
                .find(|(_, s)| i64::from(*s) == n)
                .map(|x| x.1)
        }
        serde_json::Value::String(s) => {
            let up = s.to_ascii_uppercase();
            let full = if up.starts_with("SIG") {
                up
            } else {
                format!("SIG{up}")
            };
            SIGNALS.iter().find(|(n, _)| *n == full).map(|x| x.1)
        }
        _ => None,
    }
}

/// Process ids are `proc_` + 16 hex digits.
pub fn valid_process_id(id: &str) -> bool {
    id.strip_prefix("proc_")
        .is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn signals_by_name_or_number_from_the_list_only() {
        assert_eq!(parse_signal(&json!("SIGTERM")), Some(15));
        assert_eq!(parse_signal(&json!("int")), Some(2));
        assert_eq!(parse_signal(&json!(9)), Some(9));
        assert_eq!(parse_signal(&json!(11)), None);
        assert_eq!(parse_signal(&json!("SIGSEGV")), None);
        assert_eq!(parse_signal(&json!(null)), None);
    }

    #[test]
    fn process_ids() {
        assert!(valid_process_id("proc_0123456789abcdef"));
        assert!(!valid_process_id("proc_../x"));
        assert!(!valid_process_id("1234"));
    }
}
