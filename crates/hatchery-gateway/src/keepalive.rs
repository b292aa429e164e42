//! Idle keep-alive connections to one upstream, reused by later calls.
//!
//! Why: a connection per call costs a TCP (and, for `https://`, a TLS)
//! handshake on every model call, more than the gateway's whole overhead
//! goal (docs/gateway.md, "TLS upstreams"). What keeps reuse safe:
//! - a connection comes back only once hyper says it is ready for another
//!   request, which for HTTP/1.1 means the previous answer was read to its
//!   end; an answer dropped half-read closes its connection instead, so no
//!   call can read another's bytes;
//! - a reused connection that the upstream closed meanwhile gives the
//!   request back unsent (`try_send_request`), and only then is it sent
//!   again on a fresh connection; a request that may have reached the
//!   upstream is never sent twice (a model call is not idempotent: it
//!   costs);
//! - at most [`MAX_IDLE`] wait, none older than [`IDLE_FOR`].

use bytes::Bytes;
use http_body_util::Full;
use hyper::client::conn::http1::SendRequest;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub type Sender = SendRequest<Full<Bytes>>;

/// Idle connections kept per upstream.
pub const MAX_IDLE: usize = 8;
/// An idle connection older than this is dropped rather than reused:
/// servers close idle keep-alive connections after some seconds, and a
/// request sent as one closes is the one case that cannot be retried.
pub const IDLE_FOR: Duration = Duration::from_secs(15);
/// How long a connection may take to finish its answer and come back; a
/// longer stream's connection is simply not reused.
const RETURN_WITHIN: Duration = Duration::from_secs(900);

#[derive(Clone, Default)]
pub struct Idle(Arc<Mutex<Vec<(Sender, Instant)>>>);

impl std::fmt::Debug for Idle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Idle({})", self.len())
    }
}

impl Idle {
    /// The most recently returned usable connection, if any; stale and
    /// closed ones are dropped on the way.
    pub fn take(&self) -> Option<Sender> {
        let mut v = self.0.lock().unwrap_or_else(|p| p.into_inner());
        while let Some((s, at)) = v.pop() {
            if at.elapsed() < IDLE_FOR && s.is_ready() && !s.is_closed() {
                return Some(s);
            }
        }
        None
    }

    /// Puts `s` back once its answer has been read to the end (in a task:
    /// the answer streams on after the head is returned).
    pub fn give_back_when_ready(&self, mut s: Sender) {
        let idle = self.clone();
        tokio::spawn(async move {
            if let Ok(Ok(())) = tokio::time::timeout(RETURN_WITHIN, s.ready()).await {
                idle.put(s);
            }
        });
    }

    fn put(&self, s: Sender) {
        let mut v = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if v.len() < MAX_IDLE {
            v.push((s, Instant::now()));
        }
    }

    pub fn len(&self) -> usize {
        self.0.lock().map(|v| v.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
