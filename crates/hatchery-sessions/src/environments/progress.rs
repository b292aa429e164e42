//! A build's progress, as template builds give it: every subscriber gets
//! the history first, then the live events; the stream ends after `done`
//! or `error`. The history is capped; `log` lines past the cap are sent
//! live but not kept.

use serde::Serialize;
use std::sync::{Arc, Mutex};
use tokio::sync::broadcast;

/// Events a build keeps for late subscribers.
pub const MAX_HISTORY: usize = 2000;
/// A subscriber this far behind the live stream skips events.
const LIVE_BUFFER: usize = 1024;

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum BuildEvent {
    /// `step`: `sandbox`, `fetch`, `setup`, `close_egress`, `snapshot`.
    Step {
        step: &'static str,
        percent: u8,
    },
    Log {
        line: String,
    },
    Done {
        environment_id: String,
        version: u64,
        base_commit: String,
        snapshot_id: String,
    },
    Error {
        code: &'static str,
        message: String,
    },
}

impl BuildEvent {
    pub fn name(&self) -> &'static str {
        match self {
            BuildEvent::Step { .. } => "step",
            BuildEvent::Log { .. } => "log",
            BuildEvent::Done { .. } => "done",
            BuildEvent::Error { .. } => "error",
        }
    }

    pub fn is_last(&self) -> bool {
        matches!(self, BuildEvent::Done { .. } | BuildEvent::Error { .. })
    }

    /// The `data` of its SSE event.
    pub fn data(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or_default();
        if let Some(o) = v.as_object_mut() {
            o.remove("event");
        }
        if let BuildEvent::Error { code, message } = self {
            return serde_json::json!({"error": {"code": code, "message": message}});
        }
        v
    }
}

/// One build's events.
pub struct Progress {
    history: Mutex<Vec<BuildEvent>>,
    live: broadcast::Sender<BuildEvent>,
}

impl Default for Progress {
    fn default() -> Self {
        Progress {
            history: Mutex::new(Vec::new()),
            live: broadcast::channel(LIVE_BUFFER).0,
        }
    }
}

impl Progress {
    pub fn send(&self, ev: BuildEvent) {
        let mut h = self.history.lock().unwrap_or_else(|p| p.into_inner());
        if h.len() < MAX_HISTORY || ev.is_last() || !matches!(ev, BuildEvent::Log { .. }) {
            h.push(ev.clone());
        }
        // Under the history's lock, so a subscriber sees each event once:
        // in the history it copied or on the channel it joined.
        let _ = self.live.send(ev);
    }

    /// The history so far and the live events after it.
    pub fn subscribe(self: &Arc<Self>) -> (Vec<BuildEvent>, broadcast::Receiver<BuildEvent>) {
        let h = self.history.lock().unwrap_or_else(|p| p.into_inner());
        (h.clone(), self.live.subscribe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_late_subscriber_gets_the_history_then_the_live_events() {
        let p = Arc::new(Progress::default());
        p.send(BuildEvent::Step {
            step: "sandbox",
            percent: 5,
        });
        let (h, mut rx) = p.subscribe();
        assert_eq!(h.len(), 1);
        p.send(BuildEvent::Error {
            code: "setup_failed",
            message: "exit 3".into(),
        });
        let ev = rx.recv().await.unwrap();
        assert!(ev.is_last());
        assert_eq!(
            ev.data(),
            serde_json::json!({"error": {"code": "setup_failed", "message": "exit 3"}})
        );
        assert_eq!(p.subscribe().0.len(), 2);
    }

    #[test]
    fn log_lines_past_the_cap_are_not_kept_but_the_end_is() {
        let p = Arc::new(Progress::default());
        for i in 0..MAX_HISTORY + 10 {
            p.send(BuildEvent::Log {
                line: i.to_string(),
            });
        }
        p.send(BuildEvent::Error {
            code: "x",
            message: String::new(),
        });
        let (h, _) = p.subscribe();
        assert_eq!(h.len(), MAX_HISTORY + 1);
        assert!(h.last().unwrap().is_last());
    }
}
