//! Where converted events go ([`EventSink`]), and the one thing this crate
//! asks of a local sessions service ([`SessionLog`]).

use hatchery_gateway::events::IntentError;
use hatchery_sessions::error::SessionError;
use hatchery_sessions::model_events::ModelEvent;
use hatchery_sessions::Sessions;
use std::sync::Arc;

/// Where converted events go. Delivery never fails to the caller: a sink
/// that cannot write an event logs (or counts) it, a model call is never
/// held up by its event.
#[async_trait::async_trait]
pub trait EventSink: Send + Sync + 'static {
    async fn deliver(&self, session: &str, e: ModelEvent);

    /// A call's intent, written before the call goes out: unlike
    /// [`Self::deliver`], the caller waits, and an error keeps the call
    /// from being made. By default delivered like any event.
    async fn deliver_intent(&self, session: &str, e: ModelEvent) -> Result<(), IntentError> {
        self.deliver(session, e).await;
        Ok(())
    }
}

/// A session log on this host: `e` appended to `session`'s log under the
/// delivery `key` (nothing written for a key seen before), with `joined`
/// committed in the same transaction (hatchery_db::Joined; `Alone` for
/// nothing). An error means nothing of it committed.
#[async_trait::async_trait]
pub trait SessionLog: Send + Sync + 'static {
    async fn append(
        &self,
        session: &str,
        e: ModelEvent,
        key: Option<&str>,
        joined: &mut dyn hatchery_db::Joined,
    ) -> Result<(), SessionError>;
}

#[async_trait::async_trait]
impl SessionLog for Arc<Sessions> {
    async fn append(
        &self,
        session: &str,
        e: ModelEvent,
        key: Option<&str>,
        joined: &mut dyn hatchery_db::Joined,
    ) -> Result<(), SessionError> {
        self.record_model_event_joined(session, e, key, joined)
            .await
    }
}

/// This daemon's own sessions.
pub struct LocalSink(pub Arc<dyn SessionLog>);

#[async_trait::async_trait]
impl EventSink for LocalSink {
    async fn deliver(&self, session: &str, e: ModelEvent) {
        // In process: each event is handed over once, no key needed.
        if let Err(e) = self
            .0
            .append(session, e, None, &mut hatchery_db::Alone)
            .await
        {
            // A caller that is no session of this host keeps no events.
            tracing::debug!(session, error = %e, "gateway event not recorded");
        }
    }

    async fn deliver_intent(&self, session: &str, e: ModelEvent) -> Result<(), IntentError> {
        match self
            .0
            .append(session, e, None, &mut hatchery_db::Alone)
            .await
        {
            Ok(()) => Ok(()),
            Err(SessionError::Request {
                code: "session_ended",
                ..
            })
            | Err(SessionError::NotFound(_)) => Err(IntentError::SessionEnded),
            Err(e) => Err(IntentError::NotRecorded(
                hatchery_serve::error_text::with_causes(&e),
            )),
        }
    }
}

/// Test doubles: a session log in memory.
#[cfg(test)]
pub(crate) mod fake {
    use super::*;
    use std::sync::Mutex;

    /// Records what it is asked to append; sessions not in `known` are
    /// refused (NotFound), like a caller that is no session of this host.
    /// The joined write is not run (there is no transaction here).
    #[derive(Default)]
    pub struct FakeLog {
        pub known: Vec<String>,
        pub appended: Mutex<Vec<(String, ModelEvent, Option<String>)>>,
    }

    #[async_trait::async_trait]
    impl SessionLog for FakeLog {
        async fn append(
            &self,
            session: &str,
            e: ModelEvent,
            key: Option<&str>,
            _: &mut dyn hatchery_db::Joined,
        ) -> Result<(), SessionError> {
            if !self.known.iter().any(|k| k == session) {
                return Err(SessionError::NotFound(session.into()));
            }
            self.appended
                .lock()
                .unwrap()
                .push((session.into(), e, key.map(str::to_string)));
            Ok(())
        }
    }

    /// Events a sink was handed, in order.
    #[derive(Default)]
    pub struct Collect(pub Mutex<Vec<(String, ModelEvent)>>);

    #[async_trait::async_trait]
    impl EventSink for Collect {
        async fn deliver(&self, session: &str, e: ModelEvent) {
            self.0.lock().unwrap().push((session.to_string(), e));
        }
    }

    impl Collect {
        /// Waits (up to 2 s) until `n` events arrived.
        pub async fn until(&self, n: usize) -> Vec<(String, ModelEvent)> {
            for _ in 0..400 {
                if self.0.lock().unwrap().len() >= n {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            self.0.lock().unwrap().clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fake::FakeLog;
    use super::*;

    /// The local sink appends without a key; an unknown session is
    /// dropped quietly (its caller keeps no events here).
    #[tokio::test]
    async fn the_local_sink_appends_each_event_once_without_a_key() {
        let log = Arc::new(FakeLog {
            known: vec!["ses_a".into()],
            ..Default::default()
        });
        let sink = LocalSink(log.clone());
        let ev = ModelEvent::Exhausted {
            scope: "session:ses_a".into(),
            message: "m".into(),
        };
        sink.deliver("ses_a", ev.clone()).await;
        sink.deliver("ses_b", ev.clone()).await;
        let got = log.appended.lock().unwrap().clone();
        assert_eq!(got, vec![("ses_a".to_string(), ev, None)]);
    }
}
