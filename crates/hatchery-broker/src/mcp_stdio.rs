//! The stdio transport of MCP: the server is a child process of the
//! daemon; JSON-RPC messages are single lines on its stdin/stdout. One
//! request is in flight per connection (the caller holds the server's
//! lock), so an oversized or garbled answer belongs to that request.

use crate::mcp_error::McpError;
use crate::mcp_rpc::{self, Incoming};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};

/// Environment variables the daemon passes through to a server; nothing
/// else of the daemon's environment reaches it (the operator adds what
/// the server needs in `env`).
const PASSED_ENV: &[&str] = &["PATH", "HOME", "LANG", "LC_ALL", "TZ"];
/// Server stderr lines logged per server and minute (the rest are counted).
const STDERR_LINES_PER_MINUTE: u32 = 30;

/// How to start one stdio server (from the operator's config, mcp.rs).
#[derive(Debug, Clone)]
pub struct StdioSpec {
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cwd: Option<PathBuf>,
}

pub struct StdioConn {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next_id: u64,
    /// The server said its tool list changed (`notifications/tools/list_changed`).
    pub tools_changed: bool,
}

impl StdioConn {
    pub fn spawn(server: &str, spec: &StdioSpec) -> Result<StdioConn, McpError> {
        let mut cmd = tokio::process::Command::new(&spec.argv[0]);
        cmd.args(&spec.argv[1..])
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for k in PASSED_ENV {
            if let Some(v) = std::env::var_os(k) {
                cmd.env(k, v);
            }
        }
        cmd.envs(&spec.env);
        if let Some(d) = &spec.cwd {
            cmd.current_dir(d);
        }
        // A killed daemon takes its MCP servers with it (as git children).
        // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches
        // only the calling (child) process.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| McpError::Start(format!("{}: {e}", spec.argv[0])))?;
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(McpError::Start("no stdio pipes".into()));
        };
        tokio::spawn(log_stderr(server.to_string(), stderr));
        Ok(StdioConn {
            child,
            stdin,
            stdout: BufReader::new(stdout),
            next_id: 1,
            tools_changed: false,
        })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    async fn send(&mut self, msg: &Value) -> Result<(), McpError> {
        let mut line = serde_json::to_vec(msg).map_err(|e| McpError::Protocol(e.to_string()))?;
        line.push(b'\n');
        self.stdin
            .write_all(&line)
            .await
            .map_err(|e| McpError::Closed(format!("writing to the server: {e}")))?;
        self.stdin
            .flush()
            .await
            .map_err(|e| McpError::Closed(format!("writing to the server: {e}")))
    }

    pub async fn notify(&mut self, method: &str, params: Option<Value>) -> Result<(), McpError> {
        self.send(&mcp_rpc::notification(method, params)).await
    }

    /// Sends one request and reads until its answer, answering the
    /// server's own requests (`ping`; anything else is "method not
    /// found") and noting its notifications on the way. `Ok(Err)` is a
    /// JSON-RPC error object from the server. No timeout here: the caller
    /// bounds the whole exchange and drops the connection on expiry.
    pub async fn request(
        &mut self,
        method: &str,
        params: Value,
        max_bytes: usize,
    ) -> Result<Result<Value, (i64, String)>, McpError> {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&mcp_rpc::request(id, method, params)).await?;
        loop {
            let line = read_line_capped(&mut self.stdout, max_bytes).await?;
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let msg: Value = serde_json::from_slice(&line)
                .map_err(|e| McpError::Protocol(format!("not JSON from the server: {e}")))?;
            match mcp_rpc::classify(&msg, id) {
                Incoming::ServerRequest(answer) => self.send(&answer).await?,
                Incoming::ToolsChanged => self.tools_changed = true,
                Incoming::Ignored => {}
                Incoming::Answer(a) => return Ok(a),
            }
        }
    }
}

/// One line of at most `max` bytes (without the newline).
async fn read_line_capped<R: AsyncBufRead + Unpin>(
    r: &mut R,
    max: usize,
) -> Result<Vec<u8>, McpError> {
    let mut buf = Vec::new();
    loop {
        let avail = r
            .fill_buf()
            .await
            .map_err(|e| McpError::Closed(format!("reading from the server: {e}")))?;
        if avail.is_empty() {
            return Err(McpError::Closed(
                "the server closed its output (exited?)".into(),
            ));
        }
        let (take, done) = match avail.iter().position(|b| *b == b'\n') {
            Some(i) => (i, true),
            None => (avail.len(), false),
        };
        if buf.len() + take > max {
            return Err(McpError::TooLarge(max));
        }
        buf.extend_from_slice(&avail[..take]);
        r.consume(if done { take + 1 } else { take });
        if done {
            return Ok(buf);
        }
    }
}

async fn log_stderr(server: String, stderr: tokio::process::ChildStderr) {
    let mut lines = BufReader::new(stderr).lines();
    let (mut window, mut n, mut dropped) = (std::time::Instant::now(), 0u32, 0u64);
    while let Ok(Some(l)) = lines.next_line().await {
        if window.elapsed() >= std::time::Duration::from_secs(60) {
            if dropped > 0 {
                tracing::warn!(server = %server, dropped, "mcp server stderr lines not logged");
            }
            (window, n, dropped) = (std::time::Instant::now(), 0, 0);
        }
        n += 1;
        if n <= STDERR_LINES_PER_MINUTE {
            let l: String = l.chars().take(500).collect();
            tracing::info!(server = %server, line = %l, "mcp server stderr");
        } else {
            dropped += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_are_capped() {
        let mut r = BufReader::new(&b"abc\n0123456789\nxy\n"[..]);
        assert_eq!(read_line_capped(&mut r, 5).await.unwrap(), b"abc");
        assert!(matches!(
            read_line_capped(&mut r, 5).await,
            Err(McpError::TooLarge(5))
        ));
        let mut r = BufReader::new(&b"12345\n"[..]);
        assert_eq!(read_line_capped(&mut r, 5).await.unwrap(), b"12345");
        assert!(matches!(
            read_line_capped(&mut r, 5).await,
            Err(McpError::Closed(_))
        ));
    }
}
