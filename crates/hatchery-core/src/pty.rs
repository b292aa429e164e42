//! Terminals: a program on a pseudo-terminal in a sandbox, attached to one
//! caller for as long as it runs (the API relays it over a WebSocket).
//!
//! Containment is the guest's exec containment: the agent starts the
//! program in a unit of its own and kills the whole unit when the terminal
//! ends, whichever way. Deadlines are layered as for exec: the host closes
//! a terminal whose caller sent nothing for the idle timeout, and the agent
//! has its own, later idle backstop for terminals whose host side is gone
//! (a daemon that died). Output is not capped (a terminal is open-ended);
//! the bounded agent channel is its backpressure.

use crate::agent_client::{guest_error, AgentClient, Channel};
use crate::manager::{Live, Manager};
use crate::CoreError;
use hatchery_agent_proto::{
    EndReason, Frame, Kind, PtyExit, PtyRequest, PtyResized, PtySize, PtyStarted,
};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// How long the agent may take to start the program.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// The guest's idle backstop trails the host's idle timeout by this much,
/// so the host's clock is the one that normally fires.
const GUEST_IDLE_GRACE: Duration = Duration::from_secs(30);
/// Input is relayed in frames of at most this size.
const INPUT_CHUNK: usize = 64 * 1024;

#[derive(Debug, Clone, Default)]
pub struct TerminalParams {
    /// Empty: the guest's login shell (`/bin/bash -l`, else `/bin/sh`).
    pub argv: Vec<String>,
    pub cwd: Option<String>,
    pub env: BTreeMap<String, String>,
    pub cols: u16,
    pub rows: u16,
}

#[derive(Debug, Clone, PartialEq)]
pub enum TerminalEvent {
    Output(Vec<u8>),
    /// The program ended; nothing follows.
    Exit(PtyExit),
    /// The guest's answer to a [`Terminal::resize`]: the size the terminal
    /// reports now, and why it is not the one asked for when it is not.
    Resized(PtyResized),
}

/// One attached terminal. Dropping it without [`Terminal::close`] still
/// ends the terminal in the guest.
pub struct Terminal {
    client: Arc<AgentClient>,
    ch: Channel,
    live: Arc<Live>,
    manager: Arc<Manager>,
    pub pid: i32,
    pub contained: bool,
    pub idle_timeout: Duration,
    ended: bool,
    sandbox: String,
    /// The sandbox's OOM kill count when the terminal opened: only the
    /// host sees OOM kills (the guest sees a process the shim killed for
    /// memory exit with code 1, and a shell prints nothing about it).
    ooms_at_open: Option<u64>,
}

impl Manager {
    /// Starts a terminal in sandbox `id`, under the per-sandbox limit. The
    /// sandbox's create-time env applies, under the terminal's own.
    pub async fn open_terminal(
        self: &Arc<Self>,
        id: &str,
        mut p: TerminalParams,
    ) -> Result<Terminal, CoreError> {
        let max = self.caps.max_terminal_cells as u64;
        crate::within("cols", p.cols as u64, max)?;
        crate::within("rows", p.rows as u64, max)?;
        if let Some(c) = &p.cwd {
            crate::files::validate_path(c, self.caps.max_path_bytes)?;
        }
        let live = self.live_get(id).await?;
        let mut env = live.env.clone();
        env.append(&mut p.env);
        let client = Arc::clone(&live.client);
        let ch = client.open();
        {
            let mut open = live.terminals.lock().unwrap_or_else(|e| e.into_inner());
            if open.len() >= self.caps.max_terminals_per_sandbox {
                return Err(CoreError::TooManyTerminals(
                    self.caps.max_terminals_per_sandbox,
                ));
            }
            open.insert(ch.id);
        }
        let idle_timeout = Duration::from_secs(self.caps.terminal_idle_timeout_s);
        let mut t = Terminal {
            client,
            ch,
            live,
            manager: Arc::clone(self),
            pid: 0,
            contained: false,
            idle_timeout,
            ended: false,
            sandbox: id.to_string(),
            ooms_at_open: self.runtime.oom_kills(id),
        };
        self.metrics.terminals_open.inc();
        let req = PtyRequest {
            argv: p.argv,
            cwd: p.cwd,
            env,
            size: PtySize {
                cols: p.cols,
                rows: p.rows,
            },
            idle_timeout_ms: (idle_timeout + GUEST_IDLE_GRACE).as_millis() as u64,
        };
        // On any failure below, dropping `t` frees the slot and tells the
        // guest to end whatever it may have started.
        t.client
            .send(&Frame::json(t.ch.id, Kind::PtyOpen, &req))
            .await
            .map_err(|e| CoreError::GuestUnresponsive(e.to_string()))?;
        let first = tokio::time::timeout(START_TIMEOUT, t.ch.rx.recv()).await;
        let started: PtyStarted = match first {
            Ok(Some(f)) if f.kind == Kind::PtyStarted => f
                .parse()
                .map_err(|e| CoreError::GuestUnresponsive(format!("bad start frame: {e}")))?,
            Ok(Some(f)) if f.kind == Kind::Error => {
                t.ended = true;
                return Err(guest_error(&f));
            }
            Ok(Some(f)) => {
                return Err(CoreError::GuestUnresponsive(format!(
                    "unexpected reply {:?} to a terminal open",
                    f.kind
                )))
            }
            Ok(None) => {
                return Err(CoreError::GuestUnresponsive(
                    "agent connection closed".into(),
                ))
            }
            Err(_) => {
                return Err(CoreError::GuestUnresponsive(format!(
                    "the terminal did not start within {}s",
                    START_TIMEOUT.as_secs()
                )))
            }
        };
        t.pid = started.pid;
        t.contained = started.contained;
        self.metrics.terminals_opened.inc();
        tracing::info!(sandbox = %id, pid = t.pid, contained = t.contained, "terminal opened");
        Ok(t)
    }

    /// Ends every attached terminal (graceful daemon stop), waiting up to
    /// 3 s for them to report it: sandboxes outlive the daemon, their
    /// terminals do not.
    pub(crate) async fn close_terminals(&self) {
        let lives: Vec<Arc<Live>> = self
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        for l in lives {
            let chans: Vec<u32> = l
                .terminals
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .copied()
                .collect();
            for c in chans {
                let _ = l.client.send(&Frame::new(c, Kind::PtyClose, vec![])).await;
            }
        }
        // Give their callers the exit message before the daemon is gone.
        for _ in 0..30 {
            if self.metrics.terminals_open.get() <= 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Terminal {
    /// Processes of the sandbox killed for memory since the terminal
    /// opened (any of them, not only the terminal's: the count is the
    /// sandbox's); `None` when the runtime cannot tell.
    pub fn oom_kills_since_open(&self) -> Option<u64> {
        let now = self.manager.runtime.oom_kills(&self.sandbox)?;
        Some(now.saturating_sub(self.ooms_at_open?))
    }

    /// The next thing the terminal did. An error means the sandbox (or
    /// its agent) is gone.
    pub async fn next(&mut self) -> Result<TerminalEvent, CoreError> {
        loop {
            let Some(f) = self.ch.rx.recv().await else {
                self.ended = true;
                return Err(CoreError::GuestUnresponsive(
                    "agent connection closed".into(),
                ));
            };
            match f.kind {
                Kind::PtyOutput => return Ok(TerminalEvent::Output(f.payload)),
                Kind::PtyExit => {
                    self.ended = true;
                    return match f.parse::<PtyExit>() {
                        Ok(mut e) => {
                            // The exec's rule (manager.rs): a failed end,
                            // by itself or a signal, with kills since.
                            let failed = e.exit_code != 0 && crate::manager::oom_readable(e.reason);
                            if failed && self.oom_kills_since_open().is_some_and(|n| n > 0) {
                                e.reason = EndReason::Oom;
                            }
                            Ok(TerminalEvent::Exit(e))
                        }
                        Err(e) => Err(CoreError::GuestUnresponsive(format!("bad exit frame: {e}"))),
                    };
                }
                Kind::PtyResized => {
                    return Ok(TerminalEvent::Resized(f.parse().unwrap_or_else(|e| {
                        PtyResized {
                            size: None,
                            error: Some(format!("bad resize answer: {e}")),
                        }
                    })))
                }
                Kind::Error => {
                    // The agent lost track of the program; its unit was
                    // killed on the way out.
                    self.ended = true;
                    return Err(guest_error(&f));
                }
                _ => continue,
            }
        }
    }

    /// Keystrokes (or a paste) for the program.
    pub async fn input(&self, data: &[u8]) -> Result<(), CoreError> {
        for chunk in data.chunks(INPUT_CHUNK) {
            self.client
                .send(&Frame::new(self.ch.id, Kind::PtyInput, chunk.to_vec()))
                .await
                .map_err(|e| CoreError::GuestUnresponsive(e.to_string()))?;
        }
        Ok(())
    }

    /// Asks for a new window size. The guest answers every resize with a
    /// [`TerminalEvent::Resized`] from [`Terminal::next`].
    pub async fn resize(&self, cols: u16, rows: u16) -> Result<(), CoreError> {
        let max = self.manager.caps.max_terminal_cells as u64;
        crate::within("cols", cols as u64, max)?;
        crate::within("rows", rows as u64, max)?;
        self.client
            .send(&Frame::json(
                self.ch.id,
                Kind::PtyResize,
                &PtySize { cols, rows },
            ))
            .await
            .map_err(|e| CoreError::GuestUnresponsive(e.to_string()))
    }

    /// Ends the terminal and everything started in it.
    pub async fn close(mut self) {
        if !self.ended {
            self.ended = true;
            let _ = self
                .client
                .send(&Frame::new(self.ch.id, Kind::PtyClose, vec![]))
                .await;
        }
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        self.live
            .terminals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.ch.id);
        self.manager.metrics.terminals_open.dec();
        if self.ended {
            return;
        }
        // Dropped mid-flight (a caller that went away, a failed upgrade):
        // the guest must still end it.
        let (client, chan) = (Arc::clone(&self.client), self.ch.id);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = client.send(&Frame::new(chan, Kind::PtyClose, vec![])).await;
            });
        }
    }
}
