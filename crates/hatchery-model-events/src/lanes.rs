//! One ordered lane per session in front of a sink (the control role's).

use crate::log_limit::not_written;
use crate::sink::EventSink;
use hatchery_gateway::events::IntentError;
use hatchery_sessions::model_events::ModelEvent;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// One ordered lane per session in front of a sink: events of one session
/// are delivered in order, and a session whose owner cannot be reached yet
/// (its host lost, not yet taken over) holds up only its own events.
pub struct Lanes {
    inner: Arc<dyn EventSink>,
    lanes: Arc<std::sync::Mutex<HashMap<String, mpsc::Sender<ModelEvent>>>>,
}

/// Events waiting in one session's lane; more are dropped and counted.
const LANE_QUEUE: usize = 256;
/// Sessions with a lane at once; events of more are dropped and counted.
const MAX_LANES: usize = 10_000;
/// A lane with nothing to do for this long goes.
const LANE_IDLE: Duration = Duration::from_secs(30);

impl Lanes {
    pub fn new(inner: Arc<dyn EventSink>) -> Self {
        Lanes {
            inner,
            lanes: Default::default(),
        }
    }
}

async fn lane(
    session: String,
    mut rx: mpsc::Receiver<ModelEvent>,
    inner: Arc<dyn EventSink>,
    lanes: Arc<std::sync::Mutex<HashMap<String, mpsc::Sender<ModelEvent>>>>,
) {
    loop {
        match tokio::time::timeout(LANE_IDLE, rx.recv()).await {
            Ok(Some(e)) => inner.deliver(&session, e).await,
            Ok(None) => return,
            Err(_) => {
                // Under the lock senders use: nothing can arrive between
                // the check and the removal.
                let mut m = lanes.lock().unwrap_or_else(|p| p.into_inner());
                if rx.is_empty() {
                    m.remove(&session);
                    return;
                }
            }
        }
    }
}

#[async_trait::async_trait]
impl EventSink for Lanes {
    /// Straight to the sink, not through the session's lane: the caller
    /// waits for it, and an intent written ahead of events still queued
    /// (earlier calls' outcomes) names its own reservation.
    async fn deliver_intent(&self, session: &str, e: ModelEvent) -> Result<(), IntentError> {
        self.inner.deliver_intent(session, e).await
    }

    async fn deliver(&self, session: &str, mut e: ModelEvent) {
        let mut m = self.lanes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = m.get(session) {
            match tx.try_send(e) {
                Ok(()) => return,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    return not_written(Some(session), "the session's lane is full")
                }
                // Its worker is gone (it only ends by removing itself, so
                // this is a panic): start another below.
                Err(mpsc::error::TrySendError::Closed(back)) => {
                    m.remove(session);
                    e = back;
                }
            }
        }
        if m.len() >= MAX_LANES {
            return not_written(Some(session), "too many sessions with events in flight");
        }
        let (tx, rx) = mpsc::channel(LANE_QUEUE);
        let _ = tx.try_send(e);
        m.insert(session.to_string(), tx);
        tokio::spawn(lane(
            session.to_string(),
            rx,
            self.inner.clone(),
            self.lanes.clone(),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Records deliveries; session "slow" waits for a release first.
    struct Recorder {
        seen: Mutex<Vec<String>>,
        release: tokio::sync::Notify,
    }
    #[async_trait::async_trait]
    impl EventSink for Recorder {
        async fn deliver(&self, session: &str, e: ModelEvent) {
            if session == "slow" {
                self.release.notified().await;
            }
            let ModelEvent::Exhausted { message, .. } = e else {
                unreachable!()
            };
            self.seen
                .lock()
                .unwrap()
                .push(format!("{session}:{message}"));
        }
    }

    async fn until(n: usize, seen: &dyn Fn() -> Vec<String>) {
        for _ in 0..200 {
            if seen().len() >= n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A session whose owner cannot be reached holds up its own events,
    /// not another session's; each session's stay in order.
    #[tokio::test]
    async fn one_stuck_session_does_not_hold_up_the_others() {
        let rec = Arc::new(Recorder {
            seen: Mutex::new(vec![]),
            release: tokio::sync::Notify::new(),
        });
        let lanes = Lanes::new(rec.clone());
        let ev = |m: &str| ModelEvent::Exhausted {
            scope: "s".into(),
            message: m.into(),
        };
        for (s, m) in [("slow", "1"), ("fast", "1"), ("slow", "2"), ("fast", "2")] {
            lanes.deliver(s, ev(m)).await;
        }
        let seen = || rec.seen.lock().unwrap().clone();
        until(2, &seen).await;
        assert_eq!(seen(), ["fast:1", "fast:2"]);
        rec.release.notify_one();
        until(3, &seen).await;
        rec.release.notify_one();
        until(4, &seen).await;
        assert_eq!(seen(), ["fast:1", "fast:2", "slow:1", "slow:2"]);
    }
}
