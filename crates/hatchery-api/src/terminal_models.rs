//! Wire types of terminals (`GET /v1/sandboxes/{id}/pty`, a WebSocket) and
//! their validation.

use crate::models::{validate_env, ExecReason};
use crate::ApiError;
use hatchery_core::pty::TerminalParams;
use hatchery_core::Caps;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::{IntoParams, ToSchema};

pub const DEFAULT_COLS: u16 = 80;
pub const DEFAULT_ROWS: u16 = 24;

/// The query of a terminal attach. Everything is optional: the default is
/// the sandbox's login shell in an 80×24 window at `/root`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct TerminalQuery {
    /// Window width in columns, 1..=1000 (default 80).
    pub cols: Option<i64>,
    /// Window height in rows, 1..=1000 (default 24).
    pub rows: Option<i64>,
    /// Absolute starting directory (default `/root`).
    pub cwd: Option<String>,
    /// Run this through `/bin/sh -c` instead of the login shell.
    pub cmd: Option<String>,
    /// Run this argv instead of the login shell: a JSON array of strings,
    /// e.g. `["python3","-q"]` (URL-encoded). Not with `cmd`.
    pub argv: Option<String>,
    /// Environment for the program, over the sandbox's: a JSON object of
    /// strings (URL-encoded).
    pub env: Option<String>,
    /// A token from `POST /v1/sandboxes/{id}/pty/token`, for clients that
    /// cannot send an `Authorization` header (browsers).
    pub token: Option<String>,
}

fn cells(v: Option<i64>, default: u16, name: &str, caps: &Caps) -> Result<u16, ApiError> {
    let max = caps.max_terminal_cells as i64;
    match v {
        None => Ok(default),
        Some(n) if (1..=max).contains(&n) => Ok(n as u16),
        Some(_) => Err(ApiError::bad_request(format!(
            "{name} must be between 1 and {max}"
        ))),
    }
}

impl TerminalQuery {
    pub fn into_params(self, caps: &Caps) -> Result<TerminalParams, ApiError> {
        let cols = cells(self.cols, DEFAULT_COLS, "cols", caps)?;
        let rows = cells(self.rows, DEFAULT_ROWS, "rows", caps)?;
        let argv = match (&self.cmd, self.argv) {
            (Some(_), Some(_)) => {
                return Err(ApiError::bad_request("give either cmd or argv, not both"))
            }
            (_, Some(json)) => Some(serde_json::from_str(&json).map_err(|e| {
                ApiError::bad_request(format!("argv must be a JSON array of strings: {e}"))
            })?),
            (_, None) => None,
        };
        // Neither: the sandbox's login shell.
        let argv = crate::models::command_line(self.cmd, argv, caps)?.unwrap_or_default();
        if let Some(cwd) = &self.cwd {
            hatchery_core::files::validate_path(cwd, caps.max_path_bytes)
                .map_err(|e| ApiError::bad_request(e.to_string()))?;
        }
        let env: BTreeMap<String, String> = match self.env {
            None => BTreeMap::new(),
            Some(json) => serde_json::from_str(&json).map_err(|e| {
                ApiError::bad_request(format!("env must be a JSON object of strings: {e}"))
            })?,
        };
        validate_env(&env, caps)?;
        Ok(TerminalParams {
            argv,
            cwd: self.cwd,
            env,
            cols,
            rows,
        })
    }
}

/// A token that opens one terminal of one sandbox, once, within a minute.
#[derive(Debug, Serialize, ToSchema)]
pub struct TerminalToken {
    /// Pass as `?token=` to `GET /v1/sandboxes/{id}/pty`.
    pub token: String,
    /// RFC 3339; 60 s after it was made.
    pub expires_at: String,
}

/// A text (JSON) message from the client. Binary messages are keystrokes.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum TerminalClientMessage {
    /// The window changed size: 1..=1000 columns and rows.
    Resize { cols: i64, rows: i64 },
}

/// A text (JSON) message from the server. Binary messages are the
/// terminal's output.
#[derive(Debug, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TerminalServerMessage {
    /// The program ended (the connection then closes with 1000). `reason`
    /// is `exited`, `signaled`, or `cancelled` (the daemon ended it: a
    /// graceful stop).
    Exit {
        exit_code: i32,
        signal: Option<i32>,
        reason: ExecReason,
        /// The program was killed for memory (`reason` is then `oom`).
        oom_killed: bool,
    },
    /// Processes of the sandbox were killed for memory since the terminal
    /// opened (`kills`, the count so far; sent within a second of each
    /// new kill). The terminal goes on: a shell whose child was killed
    /// stays, and prints nothing about it itself.
    Oom { kills: u64 },
    /// The server is closing the terminal: `idle_timeout` (close code
    /// 4000), `sandbox_gone` (1001) or `error` (1011).
    Closed { reason: String, message: String },
    /// A client message was refused and ignored, or a resize did not
    /// take (`resize_failed`); the terminal goes on.
    Error { code: String, message: String },
    /// The answer to each resize the guest applied: the window the
    /// terminal reports now, read back from it.
    Resized { cols: u16, rows: u16 },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Result<TerminalParams, ApiError> {
        let q: TerminalQuery = serde_urlencoded_like(s);
        q.into_params(&Caps::default())
    }

    fn serde_urlencoded_like(s: &str) -> TerminalQuery {
        let mut q = TerminalQuery::default();
        for kv in s.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = kv.split_once('=').unwrap();
            let v = v.to_string();
            match k {
                "cols" => q.cols = v.parse().ok(),
                "rows" => q.rows = v.parse().ok(),
                "cwd" => q.cwd = Some(v),
                "cmd" => q.cmd = Some(v),
                "argv" => q.argv = Some(v),
                "env" => q.env = Some(v),
                _ => panic!("{k}"),
            }
        }
        q
    }

    #[test]
    fn terminal_query_rules() {
        let p = q("").unwrap();
        assert_eq!((p.cols, p.rows, p.argv.len()), (80, 24, 0));
        let p = q("cols=1000&rows=1&cmd=top").unwrap();
        assert_eq!((p.cols, p.rows), (1000, 1));
        assert_eq!(p.argv, ["/bin/sh", "-c", "top"]);
        assert_eq!(
            q(r#"argv=["python3","-q"]"#).unwrap().argv,
            ["python3", "-q"]
        );
        assert_eq!(q(r#"env={"A":"1"}"#).unwrap().env["A"], "1");
        for bad in [
            "cols=0",
            "rows=0",
            "cols=1001",
            "rows=-3",
            "cmd=",
            "cmd=a&argv=[\"b\"]",
            "argv=[]",
            "argv=nope",
            "argv=[1]",
            "env=[]",
            r#"env={"1A":"x"}"#,
            "cwd=relative",
        ] {
            assert_eq!(q(bad).unwrap_err().status, 400, "{bad}");
        }
    }

    #[test]
    fn control_messages() {
        let m: TerminalClientMessage =
            serde_json::from_str(r#"{"type":"resize","cols":100,"rows":30}"#).unwrap();
        assert!(matches!(
            m,
            TerminalClientMessage::Resize {
                cols: 100,
                rows: 30
            }
        ));
        for bad in [
            r#"{"type":"resize","cols":100}"#,
            r#"{"type":"resize","cols":1,"rows":1,"x":1}"#,
            r#"{"type":"paste"}"#,
            "[]",
        ] {
            assert!(
                serde_json::from_str::<TerminalClientMessage>(bad).is_err(),
                "{bad}"
            );
        }
        let out = serde_json::to_value(TerminalServerMessage::Exit {
            exit_code: 0,
            signal: None,
            reason: ExecReason::Exited,
            oom_killed: false,
        })
        .unwrap();
        assert_eq!(
            out,
            serde_json::json!({"type":"exit","exit_code":0,"signal":null,"reason":"exited","oom_killed":false})
        );
    }
}
