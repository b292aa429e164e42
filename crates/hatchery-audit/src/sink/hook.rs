//! An operator's command that gets each batch's lines on stdin and must
//! exit 0 (write-once storage this crate does not speak).

use super::{AnchorSink, Batch, SinkError};
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

/// How long the hook may take before anchoring counts as failed.
pub const HOOK_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("empty command")]
    Empty,
    #[error("cannot start {prog}")]
    Spawn {
        prog: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{prog}: writing its stdin")]
    Stdin {
        prog: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{prog}: waiting for it")]
    Wait {
        prog: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{prog} exited with {status}: {stderr}")]
    Exit {
        prog: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("{prog} took over {HOOK_TIMEOUT:?}")]
    Timeout { prog: String },
}

#[derive(Debug, Clone)]
pub struct HookSink {
    /// argv; the program an absolute path (checked with the configuration).
    pub argv: Vec<String>,
}

impl AnchorSink for HookSink {
    fn kind(&self) -> &'static str {
        "hook"
    }

    fn put(&self, batch: &Batch) -> Result<(), SinkError> {
        Ok(run_hook(&self.argv, batch.jsonl.as_bytes())?)
    }
}

fn run_hook(argv: &[String], input: &[u8]) -> Result<(), HookError> {
    let (prog, args) = argv.split_first().ok_or(HookError::Empty)?;
    let prog_s = || prog.to_string();
    let mut child = Command::new(prog)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| HookError::Spawn {
            prog: prog_s(),
            source,
        })?;
    if let Some(mut stdin) = child.stdin.take() {
        match stdin.write_all(input) {
            Ok(()) => {}
            // The hook exited (or closed its stdin) before reading all of
            // it: its exit status, read below, says whether it anchored.
            // Reporting EPIPE instead lost the hook's status and stderr
            // whenever it was quicker than this write.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
            Err(source) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(HookError::Stdin {
                    prog: prog_s(),
                    source,
                });
            }
        }
    }
    let deadline = std::time::Instant::now() + HOOK_TIMEOUT;
    loop {
        match child.try_wait().map_err(|source| HookError::Wait {
            prog: prog_s(),
            source,
        })? {
            Some(st) if st.success() => return Ok(()),
            Some(status) => {
                let mut msg = String::new();
                if let Some(mut e) = child.stderr.take() {
                    use std::io::Read;
                    let _ = e.by_ref().take(4096).read_to_string(&mut msg);
                }
                return Err(HookError::Exit {
                    prog: prog_s(),
                    status,
                    stderr: msg.trim().to_string(),
                });
            }
            None if std::time::Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(HookError::Timeout { prog: prog_s() });
            }
            None => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}
