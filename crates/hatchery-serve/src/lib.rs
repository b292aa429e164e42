//! Serving an axum router to untrusted clients. `axum::serve` keeps a
//! connection that sent half a request head forever and accepts without
//! limit; this loop instead bounds every connection:
//!
//! - the request head must arrive within `header_timeout` (hyper's
//!   `header_read_timeout`, which also bounds how long an idle keep-alive
//!   connection may wait for its next request);
//! - a request body must make progress (a frame at least every
//!   `body_timeout`) and arrive in full within `body_deadline`;
//! - at most `max_connections` connections in all and
//!   `max_connections_per_peer` from one IP address; one over either cap is
//!   answered `503` (JSON, `Connection: close`) and closed.
//!
//! Responses are not timed: a server-sent-event stream or an upgraded
//! WebSocket runs as long as its handler does, since hyper only reads a new
//! head (and starts the header timer) once the response before it is done.

pub mod error_text;
pub mod headers;
pub mod json_error;
pub mod log_limit;
pub mod metrics_token;
pub mod openapi_pin;
pub mod origin;
pub mod origin_guard;
pub mod preview_token;
pub mod splice;

use axum::extract::ConnectInfo;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};

/// Connection limits, as command-line flags (both binaries flatten these).
#[derive(Debug, Clone, clap::Args)]
pub struct HttpLimits {
    /// Seconds a client has to send a complete request head; also how long
    /// an idle keep-alive connection is kept waiting for its next request.
    #[arg(long, env = "HATCHERY_HTTP_HEADER_TIMEOUT", default_value_t = 10)]
    pub http_header_timeout: u64,
    /// Seconds a request body may go without sending anything.
    #[arg(long, env = "HATCHERY_HTTP_BODY_TIMEOUT", default_value_t = 10)]
    pub http_body_timeout: u64,
    /// Seconds a whole request body may take.
    #[arg(long, env = "HATCHERY_HTTP_BODY_DEADLINE", default_value_t = 300)]
    pub http_body_deadline: u64,
    /// Most open connections in all; more are answered 503.
    #[arg(long, env = "HATCHERY_HTTP_MAX_CONNECTIONS", default_value_t = 1024)]
    pub http_max_connections: usize,
    /// Most open connections from one IP address; more are answered 503.
    #[arg(
        long,
        env = "HATCHERY_HTTP_MAX_CONNECTIONS_PER_PEER",
        default_value_t = 256
    )]
    pub http_max_connections_per_peer: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            http_header_timeout: 10,
            http_body_timeout: 10,
            http_body_deadline: 300,
            http_max_connections: 1024,
            http_max_connections_per_peer: 256,
        }
    }
}

/// Open connections, in all and per peer.
#[derive(Default)]
struct Counts {
    total: usize,
    per_peer: HashMap<IpAddr, usize>,
}

/// One admitted connection; gives its place back when dropped.
struct Slot {
    counts: Arc<Mutex<Counts>>,
    peer: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        c.total -= 1;
        if let Some(n) = c.per_peer.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                c.per_peer.remove(&self.peer);
            }
        }
    }
}

fn admit(
    counts: &Arc<Mutex<Counts>>,
    peer: IpAddr,
    limits: &HttpLimits,
) -> Result<Slot, &'static str> {
    let mut c = counts.lock().unwrap_or_else(|e| e.into_inner());
    if c.total >= limits.http_max_connections {
        return Err("too many open connections");
    }
    let n = c.per_peer.entry(peer).or_insert(0);
    if *n >= limits.http_max_connections_per_peer {
        return Err("too many open connections from this address");
    }
    *n += 1;
    c.total += 1;
    Ok(Slot {
        counts: Arc::clone(counts),
        peer,
    })
}

/// Refusals being written right now; beyond this many, an over-cap
/// connection is just closed.
const MAX_REFUSING: usize = 64;

/// Answers an over-cap connection with a 503 and closes it, reading (and
/// dropping) what the client sent for a moment so that the close is not a
/// reset that eats the answer.
async fn refuse(mut stream: TcpStream, why: &'static str) {
    let body = format!(r#"{{"error":{{"code":"capacity","message":"{why}"}}}}"#);
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\nretry-after: 1\r\n\r\n",
        body.len()
    );
    let write = async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        stream.shutdown().await
    };
    if tokio::time::timeout(Duration::from_secs(2), write)
        .await
        .is_err()
    {
        return;
    }
    let drain = async {
        let mut buf = [0u8; 4096];
        let mut total = 0;
        while total < 64 * 1024 {
            match tokio::io::AsyncReadExt::read(&mut stream, &mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
}

/// A request body that must produce a frame every `idle` and end by
/// `deadline`; otherwise it fails, and the extractor reading it answers.
struct TimeoutBody {
    inner: hyper::body::Incoming,
    idle: Duration,
    idle_timer: Pin<Box<Sleep>>,
    deadline: Pin<Box<Sleep>>,
}

#[derive(Debug)]
struct BodyTimeout(&'static str);

impl std::fmt::Display for BodyTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for BodyTimeout {}

impl http_body::Body for TimeoutBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(r) => {
                let idle = this.idle;
                this.idle_timer.as_mut().reset(Instant::now() + idle);
                return Poll::Ready(r.map(|r| r.map_err(Into::into)));
            }
            Poll::Pending => {}
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(Box::new(BodyTimeout(
                "request body took too long to arrive",
            )))));
        }
        if this.idle_timer.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(Box::new(BodyTimeout(
                "request body stalled (nothing received for too long)",
            )))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Serves `router` on `listener` with `limits` until `shutdown` resolves;
/// then stops accepting, lets each connection finish the request it is on,
/// and returns once all have closed or `drain` (if any) has passed.
pub async fn serve(
    listener: TcpListener,
    router: axum::Router,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()>,
    drain: Option<Duration>,
) -> std::io::Result<()> {
    let counts = Arc::new(Mutex::new(Counts::default()));
    let refusing = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut conns = tokio::task::JoinSet::new();
    let header = Duration::from_secs(limits.http_header_timeout.max(1));
    let body_idle = Duration::from_secs(limits.http_body_timeout.max(1));
    let body_total = Duration::from_secs(limits.http_body_deadline.max(1));
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        // Streamed answers (relayed responses, SSE) go out in pieces: with
        // Nagle on, a piece waits for the caller's delayed ACK (~40 ms).
        let _ = stream.set_nodelay(true);
        let slot = match admit(&counts, peer.ip(), &limits) {
            Ok(s) => s,
            Err(why) => {
                let n = refusing.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if n < MAX_REFUSING {
                    let refusing = Arc::clone(&refusing);
                    tokio::spawn(async move {
                        refuse(stream, why).await;
                        refusing.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    });
                } else {
                    refusing.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                }
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let router = router.clone();
        let mut stop = stop_rx.clone();
        conns.spawn(async move {
            let _slot = slot;
            let svc =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let mut router = router.clone();
                    let (mut parts, inner) = req.into_parts();
                    parts.extensions.insert(ConnectInfo(peer));
                    let body = TimeoutBody {
                        inner,
                        idle: body_idle,
                        idle_timer: Box::pin(tokio::time::sleep(body_idle)),
                        deadline: Box::pin(tokio::time::sleep(body_total)),
                    };
                    let req = hyper::Request::from_parts(parts, axum::body::Body::new(body));
                    tower_service::Service::call(&mut router, req)
                });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header)
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), svc)
                .with_upgrades();
            tokio::pin!(conn);
            loop {
                tokio::select! {
                    r = conn.as_mut() => {
                        if let Err(e) = r {
                            tracing::debug!(%peer, error = %e, "connection ended");
                        }
                        break;
                    }
                    c = stop.changed() => {
                        conn.as_mut().graceful_shutdown();
                        if c.is_err() {
                            // Sender gone: wait for the connection alone.
                            let _ = conn.as_mut().await;
                            break;
                        }
                    }
                }
            }
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    let wait_all = async { while conns.join_next().await.is_some() {} };
    match drain {
        Some(d) => {
            if tokio::time::timeout(d, wait_all).await.is_err() {
                tracing::warn!(
                    left = conns.len(),
                    "connections still open after the drain time; closing them"
                );
                conns.abort_all();
            }
        }
        None => wait_all.await,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_in_total_and_per_peer() {
        let limits = HttpLimits {
            http_max_connections: 3,
            http_max_connections_per_peer: 2,
            ..HttpLimits::default()
        };
        let counts = Arc::new(Mutex::new(Counts::default()));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let a1 = admit(&counts, a, &limits).unwrap();
        let _a2 = admit(&counts, a, &limits).unwrap();
        assert!(admit(&counts, a, &limits).is_err());
        let _b1 = admit(&counts, b, &limits).unwrap();
        assert!(admit(&counts, b, &limits).is_err(), "total cap");
        drop(a1);
        let _b2 = admit(&counts, b, &limits).unwrap();
        drop(_b1);
        drop(_b2);
        drop(_a2);
        assert_eq!(counts.lock().unwrap().total, 0);
        assert!(counts.lock().unwrap().per_peer.is_empty());
    }
}
