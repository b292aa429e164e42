//! Host side of the agent protocol: one connection per sandbox, multiplexed
//! into channels. Everything read here comes from an untrusted guest, so
//! frames are size-checked before allocation and a protocol violation
//! closes the connection (and with it, the sandbox's usefulness).

use hatchery_agent_proto::{check_len, Frame, Kind};
use hatchery_runtime::AgentStream;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::{mpsc, watch};

/// Frames buffered per channel before the reader waits: that wait is the
/// backpressure that reaches the guest's pipes.
const CHANNEL_DEPTH: usize = 32;

pub struct AgentClient {
    writer: tokio::sync::Mutex<WriteHalf<AgentStream>>,
    routes: Arc<Mutex<HashMap<u32, mpsc::Sender<Frame>>>>,
    next: AtomicU32,
    alive: Arc<AtomicBool>,
    closed: watch::Receiver<bool>,
}

/// One request's view of the connection; dropping it frees the channel.
pub struct Channel {
    pub id: u32,
    pub rx: mpsc::Receiver<Frame>,
    routes: Arc<Mutex<HashMap<u32, mpsc::Sender<Frame>>>>,
}

impl Drop for Channel {
    fn drop(&mut self) {
        self.routes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.id);
    }
}

impl AgentClient {
    pub fn new(stream: AgentStream) -> Arc<AgentClient> {
        let (r, w) = tokio::io::split(stream);
        let routes = Arc::new(Mutex::new(HashMap::new()));
        let alive = Arc::new(AtomicBool::new(true));
        let (closed_tx, closed) = watch::channel(false);
        tokio::spawn(read_loop(
            r,
            Arc::clone(&routes),
            Arc::clone(&alive),
            closed_tx,
        ));
        Arc::new(AgentClient {
            writer: tokio::sync::Mutex::new(w),
            routes,
            // A random start: after a daemon restart, a late frame from an
            // exec of the previous connection must not land in a new request.
            next: AtomicU32::new(rand::random::<u32>() >> 1 | 1),
            alive,
            closed,
        })
    }

    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// Resolves when the connection to the guest is gone.
    pub fn closed(&self) -> watch::Receiver<bool> {
        self.closed.clone()
    }

    pub fn open(&self) -> Channel {
        let (tx, rx) = mpsc::channel(CHANNEL_DEPTH);
        let mut id = self.next.fetch_add(1, Ordering::Relaxed);
        if id == 0 {
            // 0 belongs to the shim.
            id = self.next.fetch_add(1, Ordering::Relaxed);
        }
        self.routes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, tx);
        Channel {
            id,
            rx,
            routes: Arc::clone(&self.routes),
        }
    }

    pub async fn send(&self, f: &Frame) -> std::io::Result<()> {
        if !self.is_alive() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "agent connection closed",
            ));
        }
        let mut w = self.writer.lock().await;
        w.write_all(&f.encode()).await?;
        w.flush().await
    }
}

async fn read_loop(
    mut r: ReadHalf<AgentStream>,
    routes: Arc<Mutex<HashMap<u32, mpsc::Sender<Frame>>>>,
    alive: Arc<AtomicBool>,
    closed: watch::Sender<bool>,
) {
    let why = loop {
        match read_one(&mut r).await {
            Ok(Some(f)) => {
                let tx = routes
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&f.channel)
                    .cloned();
                // Frames for channels nobody listens to (a caller gave up)
                // are dropped.
                if let Some(tx) = tx {
                    let _ = tx.send(f).await;
                }
            }
            Ok(None) => break "eof".to_string(),
            Err(e) => break e.to_string(),
        }
    };
    tracing::debug!(reason = %why, "agent connection closed");
    alive.store(false, Ordering::SeqCst);
    routes.lock().unwrap_or_else(|p| p.into_inner()).clear();
    let _ = closed.send(true);
}

async fn read_one(
    r: &mut ReadHalf<AgentStream>,
) -> Result<Option<Frame>, hatchery_agent_proto::FrameError> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_be_bytes(len) as usize;
    check_len(len)?;
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await?;
    let f = Frame::decode_body(&body)?;
    if (f.kind as u8) < 100 {
        // Host-bound kinds only; a guest sending requests is misbehaving.
        return Err(hatchery_agent_proto::FrameError::UnknownKind(f.kind as u8));
    }
    Ok(Some(f))
}

/// Reads the reply to a request that answers with one `Ok` or `Error`.
pub async fn expect_ok(ch: &mut Channel) -> Result<Frame, crate::CoreError> {
    match ch.rx.recv().await {
        Some(f) if f.kind == Kind::Ok => Ok(f),
        Some(f) if f.kind == Kind::Error => Err(guest_error(&f)),
        Some(f) => Err(crate::CoreError::GuestUnresponsive(format!(
            "unexpected reply {:?}",
            f.kind
        ))),
        None => Err(crate::CoreError::GuestUnresponsive(
            "agent connection closed".into(),
        )),
    }
}

pub fn guest_error(f: &Frame) -> crate::CoreError {
    match f.parse::<hatchery_agent_proto::GuestError>() {
        Ok(e) => crate::CoreError::Guest {
            code: e.code,
            message: truncate(&e.message, 512),
        },
        Err(_) => crate::CoreError::GuestUnresponsive("malformed error from guest".into()),
    }
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}
