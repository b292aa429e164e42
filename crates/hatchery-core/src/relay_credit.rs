//! Send credit of one relayed connection (flow control in
//! `hatchery_agent_proto::relay`).
//!
//! Its own module because two sides hold it: the agent connection
//! (agent_client.rs) credits the guest's window frames to it as they
//! arrive, and the relayed stream (relay.rs) takes from it to write. Kept
//! apart, neither of those needs the other for it.

use hatchery_agent_proto::relay::{cost, CHUNK, MIN_COST, WINDOW};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

/// Send credit of one connection: what the guest has acknowledged.
pub struct Credit(Mutex<CreditState>);

struct CreditState {
    avail: u64,
    closed: bool,
    waker: Option<Waker>,
}

impl Credit {
    pub(crate) fn new() -> Arc<Credit> {
        Arc::new(Credit(Mutex::new(CreditState {
            avail: WINDOW as u64,
            closed: false,
            waker: None,
        })))
    }

    fn with<T>(&self, f: impl FnOnce(&mut CreditState) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// A window frame from the guest. A guest granting more than it could
    /// have been sent only makes its own connection faster, so it is
    /// merely capped.
    pub(crate) fn grant(&self, n: u32) {
        let w = self.with(|s| {
            s.avail = (s.avail + n as u64).min(u32::MAX as u64);
            s.waker.take()
        });
        if let Some(w) = w {
            w.wake();
        }
    }

    /// No more credit will come: the connection is gone.
    pub(crate) fn close(&self) {
        let w = self.with(|s| {
            s.closed = true;
            s.waker.take()
        });
        if let Some(w) = w {
            w.wake();
        }
    }

    /// Bytes that may be sent now (at most `want`), already taken from the
    /// credit; `None` once closed.
    pub(crate) fn poll_take(&self, cx: &mut Context<'_>, want: usize) -> Poll<Option<usize>> {
        self.with(|s| {
            if s.closed {
                return Poll::Ready(None);
            }
            if s.avail < MIN_COST as u64 {
                s.waker = Some(cx.waker().clone());
                return Poll::Pending;
            }
            let n = want.min(CHUNK).min(s.avail as usize);
            s.avail -= cost(n) as u64;
            Poll::Ready(Some(n))
        })
    }
}
