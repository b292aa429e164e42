//! Host side of the agent protocol: one connection per sandbox, multiplexed
//! into channels. Everything read here comes from an untrusted guest, so
//! frames are size-checked before allocation and a protocol violation
//! closes the connection (and with it, the sandbox's usefulness).

use crate::relay_credit::Credit;
use hatchery_agent_proto::relay::{parse_window, GUEST_CHANNEL_BIT, MAX_FRAMES_IN_FLIGHT};
use hatchery_agent_proto::{check_len, Frame, Kind, RelayIncoming};
use hatchery_runtime::AgentStream;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::{mpsc, watch};

/// Frames buffered per channel before the reader waits: that wait is the
/// backpressure that reaches the guest's pipes.
const CHANNEL_DEPTH: usize = 32;
/// A relayed connection's queue holds every frame an agent that keeps to
/// the window can have in flight, plus its shut and close: such a channel
/// never makes the reader wait, and one that overflows it is closed.
const RELAY_DEPTH: usize = MAX_FRAMES_IN_FLIGHT + 8;

struct Route {
    tx: mpsc::Sender<Frame>,
    /// Set for relayed connections: window frames are credited here at
    /// once instead of being queued behind data.
    credit: Option<Arc<Credit>>,
}

type Routes = Arc<Mutex<HashMap<u32, Route>>>;

/// The write half, shared by requests and the reader (which only ever
/// sends from spawned tasks, so that it never waits on a write).
pub(crate) struct Writer {
    w: tokio::sync::Mutex<WriteHalf<AgentStream>>,
    alive: Arc<AtomicBool>,
}

impl Writer {
    async fn send(&self, f: &Frame) -> std::io::Result<()> {
        if !self.alive.load(Ordering::SeqCst) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "agent connection closed",
            ));
        }
        let mut w = self.w.lock().await;
        w.write_all(&f.encode()).await?;
        w.flush().await
    }
}

/// A connection a guest program opened to a host service listener.
pub struct Incoming {
    pub port: u16,
    pub channel: Channel,
    pub credit: Arc<Credit>,
}

pub struct AgentClient {
    writer: Arc<Writer>,
    routes: Routes,
    next: AtomicU32,
    alive: Arc<AtomicBool>,
    closed: watch::Receiver<bool>,
    incoming: Arc<Mutex<Option<mpsc::Sender<Incoming>>>>,
    /// Relayed connections open now, host-started and guest-started.
    pub(crate) relays_out: Arc<AtomicUsize>,
    pub(crate) relays_in: Arc<AtomicUsize>,
    /// The sandbox's idle gate (idle.rs), once it is live: every channel
    /// opened passes it, which starts a parked sandbox again first.
    gate: std::sync::OnceLock<Arc<crate::idle_gate::IdleGate>>,
}

/// One request's view of the connection; dropping it frees the channel.
pub struct Channel {
    pub id: u32,
    pub rx: mpsc::Receiver<Frame>,
    routes: Routes,
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
        let routes: Routes = Arc::new(Mutex::new(HashMap::new()));
        let alive = Arc::new(AtomicBool::new(true));
        let (closed_tx, closed) = watch::channel(false);
        let writer = Arc::new(Writer {
            w: tokio::sync::Mutex::new(w),
            alive: Arc::clone(&alive),
        });
        let incoming = Arc::new(Mutex::new(None));
        tokio::spawn(read_loop(
            r,
            Reader {
                routes: Arc::clone(&routes),
                writer: Arc::clone(&writer),
                incoming: Arc::clone(&incoming),
            },
            Arc::clone(&alive),
            closed_tx,
        ));
        Arc::new(AgentClient {
            writer,
            routes,
            // A random start: after a daemon restart, a late frame from an
            // exec of the previous connection must not land in a new request.
            next: AtomicU32::new(rand::random::<u32>() >> 1 | 1),
            alive,
            closed,
            incoming,
            relays_out: Default::default(),
            relays_in: Default::default(),
            gate: Default::default(),
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
        self.open_with(CHANNEL_DEPTH, None)
    }

    /// Puts every later channel behind the sandbox's idle gate.
    pub(crate) fn set_gate(&self, gate: Arc<crate::idle_gate::IdleGate>) {
        let _ = self.gate.set(gate);
    }

    /// A channel that does not count as use: the idle parker's own
    /// question to the agent.
    pub(crate) fn open_unnoticed(&self) -> Channel {
        self.open_route(CHANNEL_DEPTH, None)
    }

    /// Channels open now, host- and guest-started: requests in flight,
    /// terminals, relayed connections.
    pub(crate) fn open_channels(&self) -> usize {
        self.routes.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// A channel for a relayed connection: a queue deep enough for the
    /// whole window, and window frames credited to `credit` directly.
    pub(crate) fn open_relay(&self, credit: Arc<Credit>) -> Channel {
        self.open_with(RELAY_DEPTH, Some(credit))
    }

    fn open_with(&self, depth: usize, credit: Option<Arc<Credit>>) -> Channel {
        // Before the route exists: the parker checks both (idle.rs).
        if let Some(g) = self.gate.get() {
            g.touch();
        }
        self.open_route(depth, credit)
    }

    fn open_route(&self, depth: usize, credit: Option<Arc<Credit>>) -> Channel {
        let (tx, rx) = mpsc::channel(depth);
        let mut routes = self.routes.lock().unwrap_or_else(|p| p.into_inner());
        // The high bit is the guest's (connections it starts); 0 is the
        // shim's; and a live id is never handed out twice.
        let id = loop {
            let id = self.next.fetch_add(1, Ordering::Relaxed) & !GUEST_CHANNEL_BIT;
            if id != 0 && !routes.contains_key(&id) {
                break id;
            }
        };
        routes.insert(id, Route { tx, credit });
        Channel {
            id,
            rx,
            routes: Arc::clone(&self.routes),
        }
    }

    /// Where connections from guest programs to host service listeners
    /// go. Without a handler they are refused.
    pub(crate) fn set_incoming(&self, tx: mpsc::Sender<Incoming>) {
        if self.is_alive() {
            *self.incoming.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
        }
    }

    pub async fn send(&self, f: &Frame) -> std::io::Result<()> {
        self.writer.send(f).await
    }

    /// Sends without waiting, for replies that must not hold anyone up.
    pub(crate) fn send_later(&self, f: Frame) {
        spawn_send(&self.writer, f);
    }
}

fn spawn_send(w: &Arc<Writer>, f: Frame) {
    let w = Arc::clone(w);
    tokio::spawn(async move {
        let _ = w.send(&f).await;
    });
}

struct Reader {
    routes: Routes,
    writer: Arc<Writer>,
    incoming: Arc<Mutex<Option<mpsc::Sender<Incoming>>>>,
}

impl Reader {
    async fn route(&self, f: Frame) {
        if f.kind == Kind::RelayIncoming {
            return self.incoming(f);
        }
        let (tx, credit) = {
            let routes = self.routes.lock().unwrap_or_else(|p| p.into_inner());
            // Frames for channels nobody listens to (a caller gave up)
            // are dropped.
            let Some(r) = routes.get(&f.channel) else {
                return;
            };
            (r.tx.clone(), r.credit.clone())
        };
        let Some(credit) = credit else {
            let _ = tx.send(f).await;
            return;
        };
        if f.kind == Kind::RelayGuestWindow {
            match parse_window(&f.payload) {
                Some(n) => credit.grant(n),
                None => self.abort_relay(f.channel),
            }
            return;
        }
        match tx.try_send(f) {
            Ok(()) => {}
            // Only a guest that ignores the window fills this queue.
            Err(mpsc::error::TrySendError::Full(f)) => self.abort_relay(f.channel),
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }

    /// Drops a relayed connection's route (its stream sees the end) and
    /// tells the guest.
    fn abort_relay(&self, chan: u32) {
        let gone = self
            .routes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&chan);
        if let Some(c) = gone.and_then(|r| r.credit) {
            c.close();
        }
        spawn_send(&self.writer, Frame::new(chan, Kind::RelayClose, vec![]));
    }

    fn incoming(&self, f: Frame) {
        let chan = f.channel;
        let port = match f.parse::<RelayIncoming>() {
            Ok(m) if chan & GUEST_CHANNEL_BIT != 0 => m.port,
            // Not a channel the guest may start: say no, route nothing.
            _ => return spawn_send(&self.writer, Frame::new(chan, Kind::RelayClose, vec![])),
        };
        let handler = self
            .incoming
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut routes = self.routes.lock().unwrap_or_else(|p| p.into_inner());
        let (Some(handler), false) = (handler, routes.contains_key(&chan)) else {
            drop(routes);
            return spawn_send(&self.writer, Frame::new(chan, Kind::RelayClose, vec![]));
        };
        let credit = Credit::new();
        let (tx, rx) = mpsc::channel(RELAY_DEPTH);
        routes.insert(
            chan,
            Route {
                tx,
                credit: Some(Arc::clone(&credit)),
            },
        );
        let channel = Channel {
            id: chan,
            rx,
            routes: Arc::clone(&self.routes),
        };
        drop(routes);
        if let Err(e) = handler.try_send(Incoming {
            port,
            channel,
            credit,
        }) {
            // The handler is swamped or gone; dropping the channel frees
            // the route.
            drop(e);
            spawn_send(&self.writer, Frame::new(chan, Kind::RelayClose, vec![]));
        }
    }
}

async fn read_loop(
    mut r: ReadHalf<AgentStream>,
    reader: Reader,
    alive: Arc<AtomicBool>,
    closed: watch::Sender<bool>,
) {
    let why = loop {
        match read_one(&mut r).await {
            Ok(Some(f)) => reader.route(f).await,
            Ok(None) => break "eof".to_string(),
            Err(e) => break e.to_string(),
        }
    };
    tracing::debug!(reason = %why, "agent connection closed");
    alive.store(false, Ordering::SeqCst);
    reader
        .incoming
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    let routes: Vec<Route> = reader
        .routes
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .drain()
        .map(|(_, r)| r)
        .collect();
    // Relayed connections waiting for credit learn that none will come.
    for c in routes.iter().filter_map(|r| r.credit.as_ref()) {
        c.close();
    }
    drop(routes);
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

#[cfg(test)]
mod hostile_frame_tests {
    //! The daemon's own reader of the agent channel. The shim checks only
    //! a frame's length and kind before passing it on, so everything else
    //! (a request kind from the guest, a forged reply) is this reader's to
    //! refuse; and it must refuse a bad length itself too, since it does
    //! not depend on the shim being the only writer.
    use super::*;
    use hatchery_agent_proto::{GuestError, MAX_FRAME};
    use std::time::Duration;
    use tokio::io::DuplexStream;

    fn client() -> (Arc<AgentClient>, DuplexStream) {
        let (host, guest) = tokio::io::duplex(4 << 20);
        (AgentClient::new(Box::pin(host)), guest)
    }

    /// A frame as raw bytes, any kind byte (valid or not).
    fn raw(channel: u32, kind: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = ((5 + payload.len()) as u32).to_be_bytes().to_vec();
        out.extend_from_slice(&channel.to_be_bytes());
        out.push(kind);
        out.extend_from_slice(payload);
        out
    }

    async fn closed_within(c: &AgentClient, d: Duration) -> bool {
        let mut rx = c.closed();
        let closed = matches!(
            tokio::time::timeout(d, rx.wait_for(|c| *c)).await,
            Ok(Ok(_))
        );
        closed
    }

    #[tokio::test]
    async fn a_hostile_frame_closes_the_connection() {
        // Promise: a forged, host-direction or oversized frame from the
        // guest ends the connection (and so the sandbox: the manager stops
        // it as guest_exited), and the request waiting on it learns so.
        // Fails if any of them is read past, or waited on (an oversized
        // length must be refused without reading its body).
        for kind in [
            Kind::Exec,
            Kind::Kill,
            Kind::FileWriteStart,
            Kind::Ping,
            Kind::RelayData,
        ] {
            let (c, mut guest) = client();
            let mut ch = c.open();
            guest
                .write_all(&raw(ch.id, kind as u8, b"{}"))
                .await
                .unwrap();
            assert!(
                closed_within(&c, Duration::from_secs(2)).await,
                "{kind:?} from the guest kept the connection"
            );
            assert!(!c.is_alive());
            assert!(ch.rx.recv().await.is_none(), "{kind:?} was delivered");
            assert!(c
                .send(&Frame::new(ch.id, Kind::Ping, vec![]))
                .await
                .is_err());
        }
        let cases: Vec<(&str, Vec<u8>)> = vec![
            // Only the prefix: the body never comes.
            (
                "over MAX_FRAME",
                ((MAX_FRAME + 1) as u32).to_be_bytes().to_vec(),
            ),
            ("4 GiB", u32::MAX.to_be_bytes().to_vec()),
            ("under the header", vec![0, 0, 0, 4, 0, 0, 0, 1]),
            ("an unknown kind", raw(1, 250, b"")),
            ("kind 0", raw(1, 0, b"")),
        ];
        for (what, bytes) in cases {
            let (c, mut guest) = client();
            let mut ch = c.open();
            guest.write_all(&bytes).await.unwrap();
            assert!(
                closed_within(&c, Duration::from_secs(2)).await,
                "a frame with {what} kept the connection"
            );
            assert!(ch.rx.recv().await.is_none(), "{what}");
        }
    }

    #[tokio::test]
    async fn a_forged_reply_for_a_channel_nobody_opened_is_dropped() {
        // A well-formed guest->host frame for a channel no request holds
        // goes nowhere, and the connection keeps serving the real one.
        // Fails if it broke the connection or reached another channel.
        let (c, mut guest) = client();
        let mut ch = c.open();
        let other = ch.id.wrapping_add(1000) & !GUEST_CHANNEL_BIT;
        guest
            .write_all(&raw(other, Kind::Stdout as u8, b"forged"))
            .await
            .unwrap();
        guest
            .write_all(&raw(other, Kind::ExitResult as u8, b"{\"exit_code\":0}"))
            .await
            .unwrap();
        guest
            .write_all(&Frame::new(ch.id, Kind::Pong, b"real".to_vec()).encode())
            .await
            .unwrap();
        let got = tokio::time::timeout(Duration::from_secs(2), ch.rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!((got.kind, &got.payload[..]), (Kind::Pong, &b"real"[..]));
        assert!(c.is_alive());
    }

    #[test]
    fn a_guest_error_message_is_cut_at_512_characters() {
        // Fails if the cap moves, or cuts inside a character (bytes, not
        // characters: a panic on multi-byte text).
        for (msg, want) in [
            ("x".repeat(512), "x".repeat(512)),
            ("x".repeat(513), "x".repeat(512)),
            ("é".repeat(600), "é".repeat(512)),
            ("short".to_string(), "short".to_string()),
        ] {
            let f = Frame::json(1, Kind::Error, &GuestError::new("io", msg));
            match guest_error(&f) {
                crate::CoreError::Guest { code, message } => {
                    assert_eq!(code, "io");
                    assert_eq!(message, want);
                }
                other => panic!("{other:?}"),
            }
        }
    }
}
