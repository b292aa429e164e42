//! Anchoring: the latest head of each chain is appended, periodically, to
//! a write-once place outside the database, so rewriting the database
//! (even consistently, hashes recomputed) is caught by comparing with
//! what was anchored. The built-in place is an append-only file (one JSON
//! line per head, fsynced before `anchor` returns); an optional external
//! command receives the same lines on stdin, for real WORM storage (an
//! object store with retention, a transparency log, ...).

use crate::store::AuditError;
use crate::verify::Head;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// How long the hook may take before anchoring counts as failed.
pub const HOOK_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnchorLine {
    pub anchored_at: String,
    pub chain: String,
    pub seq: u64,
    pub hash: String,
}

#[derive(Debug, Clone)]
pub struct Anchor {
    pub path: PathBuf,
    /// argv of a command that gets the new lines on stdin and must exit 0.
    pub hook: Option<Vec<String>>,
}

impl Anchor {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Anchor {
            path: path.into(),
            hook: None,
        }
    }

    /// Appends one line per head and fsyncs the file (and, when it was just
    /// created, its directory) before running the hook.
    pub fn anchor(&self, heads: &[Head]) -> Result<(), AuditError> {
        if heads.is_empty() {
            return Ok(());
        }
        let err = |e| AuditError::Anchor(self.path.display().to_string(), e);
        let created = !self.path.exists();
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(&self.path)
            .map_err(err)?;
        let at = crate::event::now_rfc3339();
        let mut buf = String::new();
        for h in heads {
            let line = AnchorLine {
                anchored_at: at.clone(),
                chain: h.chain.clone(),
                seq: h.seq,
                hash: h.hash.clone(),
            };
            buf.push_str(
                &serde_json::to_string(&line)
                    .map_err(|e| AuditError::Invalid("anchor", e.to_string()))?,
            );
            buf.push('\n');
        }
        // One write of whole lines: O_APPEND keeps concurrent writers'
        // lines from interleaving within a line.
        f.write_all(buf.as_bytes()).map_err(err)?;
        f.sync_all().map_err(err)?;
        if created {
            if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::File::open(dir)
                    .and_then(|d| d.sync_all())
                    .map_err(err)?;
            }
        }
        if let Some(argv) = &self.hook {
            run_hook(argv, buf.as_bytes())?;
        }
        Ok(())
    }
}

fn run_hook(argv: &[String], input: &[u8]) -> Result<(), AuditError> {
    let (prog, args) = argv
        .split_first()
        .ok_or_else(|| AuditError::Hook("empty command".into()))?;
    let mut child = Command::new(prog)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| AuditError::Hook(format!("{prog}: {e}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        match stdin.write_all(input) {
            Ok(()) => {}
            // The hook exited (or closed its stdin) before reading all of
            // it: its exit status, read below, says whether it anchored.
            // Reporting EPIPE instead lost the hook's status and stderr
            // whenever it was quicker than this write.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(AuditError::Hook(format!("{prog}: stdin: {e}")));
            }
        }
    }
    let deadline = std::time::Instant::now() + HOOK_TIMEOUT;
    loop {
        match child
            .try_wait()
            .map_err(|e| AuditError::Hook(e.to_string()))?
        {
            Some(st) if st.success() => return Ok(()),
            Some(st) => {
                let mut msg = String::new();
                if let Some(mut e) = child.stderr.take() {
                    use std::io::Read;
                    let _ = e.by_ref().take(4096).read_to_string(&mut msg);
                }
                return Err(AuditError::Hook(format!(
                    "{prog} exited with {st}: {}",
                    msg.trim()
                )));
            }
            None if std::time::Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(AuditError::Hook(format!(
                    "{prog} took over {HOOK_TIMEOUT:?}"
                )));
            }
            None => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Every head ever anchored in the file, in file order. A malformed line is
/// an error: the file is append-only, so damage there is itself a finding.
pub fn read_anchors(path: &Path) -> Result<Vec<Head>, AuditError> {
    let err = |e| AuditError::Anchor(path.display().to_string(), e);
    let text = std::fs::read_to_string(path).map_err(err)?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            let a: AnchorLine = serde_json::from_str(l).map_err(|e| {
                AuditError::Invalid("anchor line", format!("{}:{}: {e}", path.display(), i + 1))
            })?;
            Ok(Head {
                chain: a.chain,
                seq: a.seq,
                hash: a.hash,
            })
        })
        .collect()
}

/// Anchors, every `interval`, the heads that moved since the last round.
/// `heads` reads them from the store (it runs on a blocking thread). A
/// failed round is logged and retried at the next tick with everything
/// still unanchored.
pub fn spawn_periodic<F>(
    anchor: Anchor,
    interval: Duration,
    heads: F,
) -> tokio::task::JoinHandle<()>
where
    F: Fn() -> Result<Vec<Head>, AuditError> + Send + Sync + 'static,
{
    let heads = std::sync::Arc::new(heads);
    tokio::spawn(async move {
        let mut last: HashMap<String, u64> = HashMap::new();
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let (a, h, seen) = (anchor.clone(), heads.clone(), last.clone());
            let done = tokio::task::spawn_blocking(move || -> Result<Vec<Head>, AuditError> {
                let moved: Vec<Head> = h()?
                    .into_iter()
                    .filter(|x| seen.get(&x.chain) != Some(&x.seq))
                    .collect();
                a.anchor(&moved)?;
                Ok(moved)
            })
            .await;
            match done {
                Ok(Ok(moved)) => {
                    for m in moved {
                        last.insert(m.chain, m.seq);
                    }
                }
                Ok(Err(e)) => {
                    tracing::error!(error = %e, "audit anchoring failed; retrying next round")
                }
                Err(e) => tracing::error!(error = %e, "audit anchoring task failed"),
            }
        }
    })
}
