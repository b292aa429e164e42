//! Fan-out of appended events to live subscribers. The store is the truth:
//! a subscriber catches up from it, then takes events from the broadcast,
//! and goes back to the store whenever it sees a gap or falls behind, so
//! it delivers every event exactly once and in order.

use crate::events::Event;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::broadcast;

/// Events a slow subscriber may fall behind before it re-reads the store.
const CHANNEL_CAPACITY: usize = 256;

#[derive(Default)]
pub struct Bus {
    channels: Mutex<HashMap<String, broadcast::Sender<Arc<Event>>>>,
}

impl Bus {
    pub fn subscribe(&self, session: &str) -> broadcast::Receiver<Arc<Event>> {
        let mut m = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        m.entry(session.to_string())
            .or_insert_with(|| broadcast::channel(CHANNEL_CAPACITY).0)
            .subscribe()
    }

    /// Called after the events are committed.
    pub fn publish(&self, session: &str, events: &[Event]) {
        let mut m = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = m.get(session) {
            if tx.receiver_count() == 0 {
                m.remove(session);
                return;
            }
            for e in events {
                let _ = tx.send(Arc::new(e.clone()));
            }
        }
    }
}

/// Counts open event streams against a cap.
#[derive(Clone)]
pub struct StreamSlots {
    open: Arc<AtomicUsize>,
    max: usize,
}

pub struct StreamSlot(Arc<AtomicUsize>);

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl StreamSlots {
    pub fn new(max: usize) -> Self {
        StreamSlots {
            open: Arc::new(AtomicUsize::new(0)),
            max,
        }
    }
    pub fn try_take(&self) -> Option<StreamSlot> {
        let mut cur = self.open.load(Ordering::Acquire);
        loop {
            if cur >= self.max {
                return None;
            }
            match self
                .open
                .compare_exchange(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(StreamSlot(self.open.clone())),
                Err(now) => cur = now,
            }
        }
    }
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_cap() {
        let s = StreamSlots::new(2);
        let a = s.try_take().unwrap();
        let _b = s.try_take().unwrap();
        assert!(s.try_take().is_none());
        drop(a);
        assert!(s.try_take().is_some());
    }
}
