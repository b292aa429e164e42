//! A core terminal as E2B's [`Pty`]: one task owns the terminal; output
//! and commands pass by channel, so reading never blocks typing.

use crate::error::{fail, E2bBackendError};
use async_trait::async_trait;
use hatchery_core::pty::{Terminal, TerminalEvent};
use hatchery_core::CoreError;
use hatchery_e2b::backend::{BResult, Pty, PtyEvent};
use tokio::sync::{mpsc, oneshot, Mutex};

enum Cmd {
    Input(Vec<u8>, oneshot::Sender<Result<(), CoreError>>),
    Resize(u16, u16, oneshot::Sender<Result<(), CoreError>>),
}

pub(crate) struct TerminalPty {
    pid: u32,
    events: Mutex<mpsc::Receiver<BResult<PtyEvent>>>,
    cmds: mpsc::Sender<Cmd>,
    close: Mutex<Option<oneshot::Sender<()>>>,
}

impl TerminalPty {
    pub(crate) fn spawn(mut term: Terminal) -> Self {
        let pid = term.pid.max(0) as u32;
        let (etx, erx) = mpsc::channel(16);
        let (ctx, mut crx) = mpsc::channel::<Cmd>(16);
        let (close_tx, mut close_rx) = oneshot::channel::<()>();
        tokio::spawn(async move {
            enum Step {
                Ev(Result<TerminalEvent, CoreError>),
                Cmd(Option<Cmd>),
                Close,
            }
            loop {
                let step = tokio::select! {
                    ev = term.next() => Step::Ev(ev),
                    c = crx.recv() => Step::Cmd(c),
                    _ = &mut close_rx => Step::Close,
                };
                match step {
                    Step::Ev(Ok(TerminalEvent::Output(b))) => {
                        if etx.send(Ok(PtyEvent::Output(b))).await.is_err() {
                            // Nobody reads: the owner went away; keep serving
                            // input until closed.
                        }
                    }
                    Step::Ev(Ok(TerminalEvent::Exit(x))) => {
                        let signaled = x.signal.is_some();
                        let _ = etx
                            .send(Ok(PtyEvent::Exit {
                                exit_code: x.exit_code,
                                signaled,
                            }))
                            .await;
                        return;
                    }
                    // E2B's resize RPC answers once the request is sent;
                    // its protocol has no place for the guest's answer.
                    Step::Ev(Ok(TerminalEvent::Resized(_))) => {}
                    Step::Ev(Err(e)) => {
                        let _ = etx.send(Err(fail(e))).await;
                        return;
                    }
                    Step::Cmd(Some(Cmd::Input(d, r))) => {
                        let _ = r.send(term.input(&d).await);
                    }
                    Step::Cmd(Some(Cmd::Resize(c, rows, r))) => {
                        let _ = r.send(term.resize(c, rows).await);
                    }
                    Step::Cmd(None) | Step::Close => {
                        term.close().await;
                        let _ = etx
                            .send(Ok(PtyEvent::Exit {
                                exit_code: 137,
                                signaled: true,
                            }))
                            .await;
                        return;
                    }
                }
            }
        });
        TerminalPty {
            pid,
            events: Mutex::new(erx),
            cmds: ctx,
            close: Mutex::new(Some(close_tx)),
        }
    }

    async fn cmd(
        &self,
        f: impl FnOnce(oneshot::Sender<Result<(), CoreError>>) -> Cmd,
    ) -> BResult<()> {
        let (tx, rx) = oneshot::channel();
        let gone = || fail(E2bBackendError::TerminalEnded);
        self.cmds.send(f(tx)).await.map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?.map_err(fail)
    }
}

#[async_trait]
impl Pty for TerminalPty {
    fn pid(&self) -> u32 {
        self.pid
    }
    async fn next(&self) -> BResult<PtyEvent> {
        self.events
            .lock()
            .await
            .recv()
            .await
            .unwrap_or_else(|| Err(fail(E2bBackendError::TerminalEnded)))
    }
    async fn input(&self, data: &[u8]) -> BResult<()> {
        let d = data.to_vec();
        self.cmd(|tx| Cmd::Input(d, tx)).await
    }
    async fn resize(&self, cols: u16, rows: u16) -> BResult<()> {
        self.cmd(|tx| Cmd::Resize(cols, rows, tx)).await
    }
    async fn close(&self) {
        if let Some(tx) = self.close.lock().await.take() {
            let _ = tx.send(());
        }
    }
}
