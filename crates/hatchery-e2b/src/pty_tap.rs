//! A terminal's output tap. Apart from `process` because the adapter's
//! state keeps each open terminal's tap (`state::ProcDetails`), and the
//! state sits below the process service.

use crate::connect::{self, Code, ConnectError};
use crate::pb::process::process_event;
use crate::process_frames::{event, frame, Msg, Reply};
use axum::response::Response;
use tokio::sync::mpsc;

/// Where a terminal's output goes: the stream of the client that started
/// it or last connected to it. A new `Connect` takes over (the previous
/// stream ends with `aborted`); with nobody attached, output is read and
/// dropped so the program never blocks on it.
#[derive(Default)]
pub struct PtyTap {
    sub: std::sync::Mutex<Option<(Reply, mpsc::Sender<Msg>)>>,
    /// How the attached stream is cut if the sandbox dies (crate::sever).
    sever: std::sync::Mutex<Option<crate::sever::Sever>>,
}

impl PtyTap {
    fn current(&self) -> Option<(Reply, mpsc::Sender<Msg>)> {
        self.sub.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn detach(&self, tx: &mpsc::Sender<Msg>) {
        let mut g = self.sub.lock().unwrap_or_else(|p| p.into_inner());
        if g.as_ref().is_some_and(|(_, cur)| cur.same_channel(tx)) {
            *g = None;
        }
    }

    /// Ends the attached stream by dropping its connection (the sandbox
    /// died).
    pub(crate) fn sever_current(&self) {
        if let Some(s) = self.sever.lock().unwrap_or_else(|p| p.into_inner()).take() {
            s.cut();
        }
        self.sub.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    /// Attaches a new stream, sending it the start event first.
    pub(crate) async fn attach(&self, kind: Reply, pid: u32) -> Response {
        let (tx, rx) = mpsc::channel::<Msg>(16);
        let start = event(process_event::Event::Start(process_event::StartEvent {
            pid,
        }));
        let _ = tx.send(frame(kind, start)).await;
        let old = self
            .sub
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .replace((kind, tx));
        if let Some((_, old)) = old {
            let e = ConnectError::new(Code::Aborted, "another client connected to this terminal");
            let _ = old.try_send(connect::end_stream(Some(&e)));
        }
        let sever = crate::sever::Sever::default();
        *self.sever.lock().unwrap_or_else(|p| p.into_inner()) = Some(sever.clone());
        connect::severable_stream_response(tokio_stream::wrappers::ReceiverStream::new(rx), sever)
    }

    pub(crate) async fn send(&self, f: impl Fn(Reply) -> Msg) {
        if let Some((kind, tx)) = self.current() {
            if tx.send(f(kind)).await.is_err() {
                self.detach(&tx);
            }
        }
    }
}
