//! Host end of relayed TCP connections (wire format and flow control in
//! `hatchery_agent_proto::relay`): a [`RelayStream`] is an `AsyncRead +
//! AsyncWrite` over one channel of a sandbox's agent connection, so that
//! hyper, `copy_bidirectional` and friends can use a port inside a guest
//! as if it were a socket, without the sandbox having any route to the
//! host.
//!
//! Everything arriving here came from an untrusted guest: data beyond the
//! window closes the connection (`agent_client`), unexpected frames abort
//! it, and nothing a guest sends is logged unthrottled.

use crate::agent_client::{guest_error, AgentClient, Channel};
use crate::metrics::Meters;
use crate::CoreError;
use hatchery_agent_proto::relay::{cost, window_payload, ACK_EVERY};
use hatchery_agent_proto::{Frame, Kind, RelayOpen};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;

// Credit has its own module (relay_credit.rs) so that the agent connection
// needs nothing from this one; its public path stays `relay::Credit`.
pub use crate::relay_credit::Credit;

/// How long the guest gets to answer a `RelayOpen` (a loopback connect).
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);

/// Counts one relayed connection against a per-sandbox cap for as long as
/// it lives.
pub(crate) struct Slot(Arc<AtomicUsize>);

impl Slot {
    pub(crate) fn try_take(n: &Arc<AtomicUsize>, max: usize) -> Option<Slot> {
        n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
            (v < max).then_some(v + 1)
        })
        .ok()
        .map(|_| Slot(Arc::clone(n)))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One relayed TCP connection. Writes are queued to a sender task in
/// order (bounded by the guest's window); reads come straight off the
/// channel. Dropping it aborts the connection unless both directions had
/// already ended.
pub struct RelayStream {
    id: u32,
    rx: mpsc::Receiver<Frame>,
    out: mpsc::UnboundedSender<Frame>,
    failed: Arc<AtomicBool>,
    credit: Arc<Credit>,
    read_buf: Vec<u8>,
    read_pos: usize,
    /// The guest half-closed (clean end of the read side).
    read_eof: bool,
    /// Aborted by the guest, by the connection dying, or by us.
    aborted: bool,
    shut_sent: bool,
    unacked: u32,
    meters: Meters,
    // Held for the life of the stream: the route and the cap slot.
    _channel: ChannelGuard,
    _slot: Slot,
}

/// Keeps the channel's route registered; the receiver itself lives in the
/// stream.
struct ChannelGuard(#[allow(dead_code)] Channel);

impl RelayStream {
    pub(crate) fn new(
        client: &Arc<AgentClient>,
        mut channel: Channel,
        credit: Arc<Credit>,
        slot: Slot,
        meters: Meters,
    ) -> RelayStream {
        let id = channel.id;
        // The receiver moves into the stream; the (empty) channel stays to
        // own the route.
        let (_, dummy) = mpsc::channel(1);
        let rx = std::mem::replace(&mut channel.rx, dummy);
        let (out, mut queue) = mpsc::unbounded_channel::<Frame>();
        let failed = Arc::new(AtomicBool::new(false));
        let (c, f) = (Arc::clone(client), Arc::clone(&failed));
        tokio::spawn(async move {
            while let Some(frame) = queue.recv().await {
                if c.send(&frame).await.is_err() {
                    f.store(true, Ordering::SeqCst);
                    break;
                }
            }
        });
        meters.open.inc();
        RelayStream {
            id,
            rx,
            out,
            failed,
            credit,
            read_buf: Vec::new(),
            read_pos: 0,
            read_eof: false,
            aborted: false,
            shut_sent: false,
            unacked: 0,
            meters,
            _channel: ChannelGuard(channel),
            _slot: slot,
        }
    }

    fn queue(&self, kind: Kind, payload: Vec<u8>) {
        let _ = self.out.send(Frame::new(self.id, kind, payload));
    }

    fn abort(&mut self) {
        if !self.aborted {
            self.aborted = true;
            self.credit.close();
        }
    }

    fn reset() -> io::Error {
        io::Error::new(io::ErrorKind::ConnectionReset, "relayed connection reset")
    }
}

impl AsyncRead for RelayStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = &mut *self;
        loop {
            if me.read_pos < me.read_buf.len() {
                let n = buf.remaining().min(me.read_buf.len() - me.read_pos);
                buf.put_slice(&me.read_buf[me.read_pos..me.read_pos + n]);
                me.read_pos += n;
                me.meters.from_guest.inc_by(n as u64);
                return Poll::Ready(Ok(()));
            }
            if me.read_eof {
                return Poll::Ready(Ok(()));
            }
            if me.aborted {
                return Poll::Ready(Err(Self::reset()));
            }
            let f = match me.rx.poll_recv(cx) {
                Poll::Pending => return Poll::Pending,
                // The route is gone: the agent connection died, or the
                // guest overran its window.
                Poll::Ready(None) => {
                    me.abort();
                    continue;
                }
                Poll::Ready(Some(f)) => f,
            };
            match f.kind {
                Kind::RelayGuestData => {
                    me.unacked += cost(f.payload.len());
                    if me.unacked >= ACK_EVERY {
                        me.queue(Kind::RelayWindow, window_payload(me.unacked));
                        me.unacked = 0;
                    }
                    me.read_buf = f.payload;
                    me.read_pos = 0;
                }
                Kind::RelayGuestShut => me.read_eof = true,
                Kind::RelayGuestClose => me.abort(),
                _ => {
                    // Anything else on a relay channel is a guest breaking
                    // the protocol: end this connection, nothing more.
                    me.queue(Kind::RelayClose, vec![]);
                    me.abort();
                }
            }
        }
    }
}

impl AsyncWrite for RelayStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let me = &mut *self;
        if me.shut_sent || me.failed.load(Ordering::SeqCst) {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        match me.credit.poll_take(cx, buf.len()) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => Poll::Ready(Err(Self::reset())),
            Poll::Ready(Some(n)) => {
                me.queue(Kind::RelayData, buf[..n].to_vec());
                me.meters.to_guest.inc_by(n as u64);
                Poll::Ready(Ok(n))
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.failed.load(Ordering::SeqCst) {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.shut_sent {
            self.shut_sent = true;
            self.queue(Kind::RelayShut, vec![]);
        }
        Poll::Ready(Ok(()))
    }
}

impl Drop for RelayStream {
    fn drop(&mut self) {
        self.meters.open.dec();
        // Both ends shut cleanly: the agent has forgotten the connection.
        // Aborted by the guest: nothing to say either.
        let finished = self.shut_sent && self.read_eof;
        if !finished && !self.aborted {
            self.queue(Kind::RelayClose, vec![]);
        }
        self.credit.close();
    }
}

/// Opens a connection to `127.0.0.1:port` inside the guest.
pub(crate) async fn open_port(
    client: &Arc<AgentClient>,
    port: u16,
    max: usize,
    metrics: &crate::metrics::RelayMetrics,
) -> Result<RelayStream, CoreError> {
    let slot = Slot::try_take(&client.relays_out, max).ok_or(CoreError::TooManyConnections(
        format!("this sandbox already has {max} relayed connections open"),
    ))?;
    let credit = Credit::new();
    let mut ch = client.open_relay(Arc::clone(&credit));
    client
        .send(&Frame::json(ch.id, Kind::RelayOpen, &RelayOpen { port }))
        .await
        .map_err(|e| CoreError::GuestUnresponsive(e.to_string()))?;
    let reply = tokio::time::timeout(OPEN_TIMEOUT, ch.rx.recv()).await;
    let err = match reply {
        Ok(Some(f)) if f.kind == Kind::RelayOpened => {
            return Ok(RelayStream::new(
                client,
                ch,
                credit,
                slot,
                metrics.meters("port"),
            ));
        }
        Ok(Some(f)) if f.kind == Kind::Error => match guest_error(&f) {
            CoreError::Guest { code, message }
                if code == "port_closed" || code == "connect_failed" =>
            {
                return Err(CoreError::PortClosed(format!(
                    "nothing is listening on port {port} in the sandbox ({message})"
                )))
            }
            other => other,
        },
        Ok(Some(f)) => CoreError::GuestUnresponsive(format!("unexpected reply {:?}", f.kind)),
        Ok(None) => CoreError::GuestUnresponsive("agent connection closed".into()),
        Err(_) => CoreError::GuestUnresponsive(format!(
            "no answer to a connect to port {port} within {}s",
            OPEN_TIMEOUT.as_secs()
        )),
    };
    // Whatever the guest does later with this channel, the host is done.
    client.send_later(Frame::new(ch.id, Kind::RelayClose, vec![]));
    Err(err)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::metrics::Metrics;
    use hatchery_agent_proto::relay::{CHUNK, GUEST_CHANNEL_BIT, MIN_COST, WINDOW};
    use hatchery_agent_proto::{read_frame, GuestError, RelayIncoming};
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    /// The agent's end of a fake connection: whole frames both ways.
    pub(crate) struct FakeAgent(DuplexStream);

    impl FakeAgent {
        pub(crate) async fn recv(&mut self) -> Frame {
            let mut len = [0u8; 4];
            self.0.read_exact(&mut len).await.unwrap();
            let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
            self.0.read_exact(&mut body).await.unwrap();
            let mut whole = len.to_vec();
            whole.extend_from_slice(&body);
            read_frame(&mut &whole[..]).unwrap().unwrap()
        }

        pub(crate) async fn send(&mut self, f: Frame) {
            self.0.write_all(&f.encode()).await.unwrap();
        }

        /// Answers the next RelayOpen with `reply`; returns its channel.
        async fn accept_open(&mut self, reply: Option<&str>) -> u32 {
            let f = self.recv().await;
            assert_eq!(f.kind, Kind::RelayOpen);
            let r = match reply {
                None => Frame::new(f.channel, Kind::RelayOpened, vec![]),
                Some(code) => Frame::json(f.channel, Kind::Error, &GuestError::new(code, "no")),
            };
            self.send(r).await;
            f.channel
        }
    }

    pub(crate) fn pair() -> (Arc<AgentClient>, FakeAgent) {
        let (a, b) = tokio::io::duplex(8 << 20);
        (AgentClient::new(Box::pin(a)), FakeAgent(b))
    }

    async fn opened(max: usize) -> (Arc<AgentClient>, FakeAgent, RelayStream, u32, Metrics) {
        let (client, mut agent) = pair();
        let m = Metrics::new();
        let c = Arc::clone(&client);
        let relay = m.relay.clone();
        let open = tokio::spawn(async move { open_port(&c, 8000, max, &relay).await });
        let chan = agent.accept_open(None).await;
        let s = open.await.unwrap().unwrap();
        (client, agent, s, chan, m)
    }

    #[tokio::test]
    async fn bytes_flow_both_ways_and_close_cleanly() {
        let (_client, mut agent, mut s, chan, m) = opened(4).await;
        s.write_all(b"GET / HTTP/1.0\r\n\r\n").await.unwrap();
        let f = agent.recv().await;
        assert_eq!((f.channel, f.kind), (chan, Kind::RelayData));
        assert_eq!(f.payload, b"GET / HTTP/1.0\r\n\r\n");
        agent
            .send(Frame::new(chan, Kind::RelayGuestData, b"hello".to_vec()))
            .await;
        agent
            .send(Frame::new(chan, Kind::RelayGuestShut, vec![]))
            .await;
        let mut got = Vec::new();
        s.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"hello");
        s.shutdown().await.unwrap();
        assert_eq!(agent.recv().await.kind, Kind::RelayShut);
        drop(s);
        let text = m.render();
        assert!(
            text.contains(r#"hatchery_relay_bytes_total{direction="from_guest",kind="port"} 5"#),
            "{text}"
        );
        assert!(text.contains(r#"hatchery_relay_open{kind="port"} 0"#));
        // Both ends shut: nothing more is said on the channel.
        let ping = Frame::new(1, Kind::Ping, vec![]);
        _client.send(&ping).await.unwrap();
        assert_eq!(agent.recv().await.kind, Kind::Ping);
    }

    #[tokio::test]
    async fn writes_stop_at_the_window_until_the_guest_acknowledges() {
        let (_client, mut agent, mut s, chan, _m) = opened(4).await;
        let big = vec![7u8; WINDOW as usize * 2];
        let writer = tokio::spawn(async move {
            s.write_all(&big).await.unwrap();
            s
        });
        let mut seen = 0usize;
        while seen < WINDOW as usize {
            let f = agent.recv().await;
            assert_eq!(f.kind, Kind::RelayData);
            assert!(f.payload.len() <= CHUNK);
            seen += f.payload.len();
        }
        assert_eq!(seen, WINDOW as usize, "never more than the window");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!writer.is_finished(), "the writer waits for credit");
        agent
            .send(Frame::new(
                chan,
                Kind::RelayGuestWindow,
                window_payload(WINDOW),
            ))
            .await;
        while seen < 2 * WINDOW as usize {
            seen += agent.recv().await.payload.len();
        }
        let s = writer.await.unwrap();
        drop(s);
        assert_eq!(
            agent.recv().await.kind,
            Kind::RelayClose,
            "a drop mid-stream aborts"
        );
    }

    #[tokio::test]
    async fn reads_acknowledge_and_a_guest_over_its_window_is_cut_off() {
        let (_client, mut agent, mut s, chan, _m) = opened(4).await;
        // Within the window, acknowledged as it is read.
        for _ in 0..ACK_EVERY / MIN_COST {
            agent
                .send(Frame::new(chan, Kind::RelayGuestData, vec![1]))
                .await;
        }
        let mut buf = [0u8; 1];
        for _ in 0..ACK_EVERY / MIN_COST {
            s.read_exact(&mut buf).await.unwrap();
        }
        let f = agent.recv().await;
        assert_eq!(f.kind, Kind::RelayWindow);
        assert_eq!(
            hatchery_agent_proto::relay::parse_window(&f.payload),
            Some(ACK_EVERY)
        );
        // Far past it, unread: the connection is closed, not the channel.
        for _ in 0..400 {
            agent
                .send(Frame::new(chan, Kind::RelayGuestData, vec![2]))
                .await;
        }
        assert_eq!(agent.recv().await.kind, Kind::RelayClose);
        let mut rest = Vec::new();
        assert!(s.read_to_end(&mut rest).await.is_err());
        assert!(_client.is_alive(), "other channels are unaffected");
    }

    #[tokio::test]
    async fn refusals_map_to_clear_errors() {
        let (client, mut agent) = pair();
        let m = Metrics::new();
        let c = Arc::clone(&client);
        let relay = m.relay.clone();
        let open = tokio::spawn(async move { open_port(&c, 8001, 4, &relay).await });
        agent.accept_open(Some("port_closed")).await;
        assert!(matches!(open.await.unwrap(), Err(CoreError::PortClosed(_))));
        // The cap counts open streams, and frees on drop.
        let c = Arc::clone(&client);
        let relay = m.relay.clone();
        let open = tokio::spawn(async move { open_port(&c, 8000, 1, &relay).await });
        agent.accept_open(None).await;
        let first = open.await.unwrap().unwrap();
        assert!(matches!(
            open_port(&client, 8000, 1, &m.relay).await,
            Err(CoreError::TooManyConnections(_))
        ));
        drop(first);
        assert_eq!(agent.recv().await.kind, Kind::RelayClose);
        let c = Arc::clone(&client);
        let relay = m.relay.clone();
        let open = tokio::spawn(async move { open_port(&c, 8000, 1, &relay).await });
        agent.accept_open(None).await;
        assert!(open.await.unwrap().is_ok());
    }

    #[tokio::test]
    async fn guest_started_connections_need_the_guest_bit_and_a_handler() {
        let (client, mut agent) = pair();
        let inc = |chan| Frame::json(chan, Kind::RelayIncoming, &RelayIncoming { port: 9 });
        // No handler yet: refused.
        agent.send(inc(GUEST_CHANNEL_BIT | 1)).await;
        let f = agent.recv().await;
        assert_eq!(
            (f.channel, f.kind),
            (GUEST_CHANNEL_BIT | 1, Kind::RelayClose)
        );
        let (tx, mut rx) = mpsc::channel(4);
        client.set_incoming(tx);
        // A host-side channel id: refused.
        agent.send(inc(5)).await;
        assert_eq!(agent.recv().await.kind, Kind::RelayClose);
        agent.send(inc(GUEST_CHANNEL_BIT | 2)).await;
        agent
            .send(Frame::new(
                GUEST_CHANNEL_BIT | 2,
                Kind::RelayGuestData,
                b"hi".to_vec(),
            ))
            .await;
        let got = rx.recv().await.unwrap();
        assert_eq!((got.port, got.channel.id), (9, GUEST_CHANNEL_BIT | 2));
        let m = Metrics::new();
        let slot = Slot::try_take(&client.relays_in, 1).unwrap();
        let mut s = RelayStream::new(
            &client,
            got.channel,
            got.credit,
            slot,
            m.relay.meters("host_service"),
        );
        let mut buf = [0u8; 2];
        s.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"hi");
    }
}
