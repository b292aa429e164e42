//! The gateway's [`GatewayEvents`]: a bounded queue to one writer task, and
//! a settled call's event committed with its settle.

use crate::convert::model_event;
use crate::log_limit::{answered_first, not_written};
use crate::sink::{EventSink, LocalSink, SessionLog};
use hatchery_gateway::budget::{BudgetError, BudgetStore};
use hatchery_gateway::events::{GatewayEvent, GatewayEvents, IntentError};
use hatchery_gateway::store::Settlement;
use hatchery_sessions::model_events::ModelEvent;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// Events waiting for their writer; past it they are dropped and counted,
/// never blocking a model call.
const EVENT_QUEUE: usize = 4096;

/// How long a caller waits for an event it must see recorded before its
/// answer ([`GatewayEvents::record_first`]); past it the answer goes out
/// and the event is still written in its turn.
const RECORD_FIRST_WAIT: Duration = Duration::from_secs(2);

/// What the writer task is handed: an observation (with whom to tell once
/// its sink took it), or a settled call's event already carrying its
/// settle (the control role's).
enum Queued {
    Observed(GatewayEvent, Option<oneshot::Sender<()>>),
    Settling(String, ModelEvent),
}

/// The gateway's [`GatewayEvents`]: a bounded queue to one writer task,
/// which delivers in the order the events happened.
pub struct QueuedEvents {
    tx: mpsc::Sender<Queued>,
    /// Where intents go, straight, not through the queue (the caller
    /// waits for them).
    sink: Arc<dyn EventSink>,
    /// This daemon's sessions, on the gateway's own database: a settled
    /// call's event goes there in the settle's transaction, not through
    /// the queue.
    local: Option<Arc<dyn SessionLog>>,
}

impl QueuedEvents {
    /// The gateway beside this daemon's sessions, on the one database.
    pub fn local(sessions: Arc<dyn SessionLog>) -> Self {
        let mut q = Self::spawn(Arc::new(LocalSink(sessions.clone())));
        q.local = Some(sessions);
        q
    }

    /// Events delivered to `sink` in the order they happened, by one task.
    pub fn spawn(sink: Arc<dyn EventSink>) -> Self {
        let (tx, mut rx) = mpsc::channel::<Queued>(EVENT_QUEUE);
        let writer = sink.clone();
        tokio::spawn(async move {
            while let Some(q) = rx.recv().await {
                let (e, done) = match q {
                    Queued::Observed(e, done) => (model_event(e), done),
                    Queued::Settling(session, ev) => (Some((session, ev)), None),
                };
                if let Some((session, ev)) = e {
                    writer.deliver(&session, ev).await;
                }
                if let Some(done) = done {
                    let _ = done.send(());
                }
            }
        });
        QueuedEvents {
            tx,
            sink,
            local: None,
        }
    }
}

#[async_trait::async_trait]
impl GatewayEvents for QueuedEvents {
    fn record(&self, e: GatewayEvent) {
        if self.tx.try_send(Queued::Observed(e, None)).is_err() {
            not_written(None, "the gateway's event queue is full");
        }
    }

    /// Through the queue, so that it stays in order with the events
    /// before it, and waited for until the sink took it: written, with
    /// the sessions local; handed to its session's lane, on the control
    /// role (whose post to the owner may take longer than a caller should
    /// wait).
    async fn record_first(&self, e: GatewayEvent) {
        let (done, taken) = oneshot::channel();
        if self.tx.try_send(Queued::Observed(e, Some(done))).is_err() {
            return not_written(None, "the gateway's event queue is full");
        }
        if tokio::time::timeout(RECORD_FIRST_WAIT, taken)
            .await
            .is_err()
        {
            answered_first();
        }
    }

    /// To the sink directly (the local sessions' log, or the owner's by
    /// a post), waited for: the call goes out only once it is written.
    async fn intent(&self, e: GatewayEvent) -> Result<(), IntentError> {
        match model_event(e) {
            Some((session, ev)) => self.sink.deliver_intent(&session, ev).await,
            None => Ok(()),
        }
    }

    /// The call's `model_call` event, the session's spend, its delivery
    /// key (the reservation id) and the settle, in one transaction
    /// (docs/sessions.md, "What each commit guarantees"): here with the
    /// sessions local; on the control role in the owner's, the settle
    /// posted with the event (`RemoteSink`; `Ok(true)` once queued). A
    /// caller that is no session has its spend settled alone.
    async fn settle(
        &self,
        store: &dyn BudgetStore,
        mut s: Settlement,
        called: GatewayEvent,
    ) -> Result<bool, BudgetError> {
        let Some((session, mut ev)) = model_event(called) else {
            return store.settle_call(&s).await;
        };
        let Some(sessions) = &self.local else {
            if let (ModelEvent::Called { joined, .. }, Ok(w)) = (&mut ev, serde_json::to_value(&s))
            {
                *joined = Some(w);
                if self.tx.try_send(Queued::Settling(session, ev)).is_ok() {
                    return Ok(true);
                }
                not_written(None, "the gateway's event queue is full");
            }
            return store.settle_call(&s).await;
        };
        let key = s.id.clone();
        match sessions.append(&session, ev, Some(&key), &mut s).await {
            Ok(()) => Ok(s.fresh),
            Err(e) => {
                // Nothing of it committed; the spend still counts.
                tracing::debug!(session, error = %e, "gateway event not recorded");
                store.settle_call(&s).await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::fake::{Collect, FakeLog};
    use hatchery_gateway::budget::{Amount, Caller};
    use hatchery_gateway::store::GatewayStore;
    use hatchery_gateway::usage::Flavor;
    use hatchery_sessions::Sessions;

    fn caller() -> Caller {
        Caller {
            session: "ses_a".into(),
            tenant: None,
        }
    }

    fn called(who: &Caller, a: Amount) -> GatewayEvent {
        GatewayEvent::Called {
            caller: who.clone(),
            flavor: Flavor::OpenAi,
            model: "m".into(),
            input_tokens: Some(2),
            output_tokens: Some(3),
            charged: a,
            reserved: a,
        }
    }

    /// Observations reach the sink converted and in order; those with no
    /// session to log to do not.
    #[tokio::test]
    async fn observations_reach_the_sink_in_order() {
        let sink = Arc::new(Collect::default());
        let q = QueuedEvents::spawn(sink.clone());
        let refused = |code: &'static str, who: Option<Caller>| GatewayEvent::Refused {
            caller: who,
            flavor: Flavor::Anthropic,
            code,
            message: code.into(),
        };
        q.record(refused("first", Some(caller())));
        q.record(refused("nobody", None));
        q.record(refused("second", Some(caller())));
        let got = sink.until(2).await;
        let codes: Vec<_> = got
            .iter()
            .map(|(s, e)| match e {
                ModelEvent::Refused { code, .. } => format!("{s}:{code}"),
                e => panic!("{e:?}"),
            })
            .collect();
        assert_eq!(codes, ["ses_a:first", "ses_a:second"]);
    }

    /// A sink that takes 50 ms per event, or never returns.
    struct Slow {
        got: std::sync::Mutex<Vec<ModelEvent>>,
        stuck: bool,
    }
    #[async_trait::async_trait]
    impl EventSink for Slow {
        async fn deliver(&self, _: &str, e: ModelEvent) {
            if self.stuck {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            self.got.lock().unwrap().push(e);
        }
    }

    fn exhausted() -> GatewayEvent {
        GatewayEvent::Exhausted {
            caller: caller(),
            scope: "session:ses_a".into(),
        }
    }

    /// `record_first` returns once the sink took the event, after the
    /// events queued before it: the answer that follows is never ahead
    /// of its log line.
    #[tokio::test]
    async fn record_first_waits_for_the_sink() {
        let sink = Arc::new(Slow {
            got: Default::default(),
            stuck: false,
        });
        let q = QueuedEvents::spawn(sink.clone());
        q.record(called(
            &caller(),
            Amount {
                tokens: 1,
                usd_cents: 0,
            },
        ));
        q.record_first(exhausted()).await;
        let got = sink.got.lock().unwrap().clone();
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(matches!(got[1], ModelEvent::Exhausted { .. }), "{got:?}");
    }

    /// A sink that never finishes holds the answer for the bound only.
    #[tokio::test]
    async fn record_first_gives_up_after_its_bound() {
        let sink = Arc::new(Slow {
            got: Default::default(),
            stuck: true,
        });
        let q = QueuedEvents::spawn(sink.clone());
        let t0 = tokio::time::Instant::now();
        q.record_first(exhausted()).await;
        let waited = t0.elapsed();
        assert!(
            waited >= RECORD_FIRST_WAIT && waited < RECORD_FIRST_WAIT * 3,
            "{waited:?}"
        );
    }

    /// An intent goes to the local log at once (the caller waits for it),
    /// converted; a session the log does not know refuses the call.
    #[tokio::test]
    async fn an_intent_is_written_before_the_answer_or_refuses_the_call() {
        let log = Arc::new(FakeLog {
            known: vec!["ses_a".into()],
            ..Default::default()
        });
        let q = QueuedEvents::local(log.clone());
        let intent = |session: &str| GatewayEvent::Requested {
            caller: Caller {
                session: session.into(),
                tenant: None,
            },
            flavor: Flavor::OpenAi,
            model: "m".into(),
            reservation: "rsv_1".into(),
            reserved: Amount {
                tokens: 70,
                usd_cents: 2,
            },
        };
        q.intent(intent("ses_a")).await.unwrap();
        let got = log.appended.lock().unwrap().clone();
        assert_eq!(
            got,
            vec![(
                "ses_a".to_string(),
                ModelEvent::Requested {
                    api: "openai".into(),
                    model: "m".into(),
                    reservation: "rsv_1".into(),
                    tokens: 70,
                    usd_cents: 2,
                },
                None
            )]
        );
        assert!(matches!(
            q.intent(intent("ses_gone")).await,
            Err(IntentError::SessionEnded)
        ));
    }

    /// A local log that refuses the event (the caller is no session of
    /// this host) commits nothing: the settle is made alone, the spend
    /// still counts.
    #[tokio::test]
    async fn a_refused_local_event_still_settles_the_spend() {
        let budgets = GatewayStore::open_in_memory().await.unwrap();
        let log = Arc::new(FakeLog::default());
        let q = QueuedEvents::local(log.clone());
        let who = caller();
        let one = Amount {
            tokens: 5,
            usd_cents: 1,
        };
        budgets
            .reserve("rsv_d", &who.scopes(), one, 0, 60_000)
            .await
            .unwrap();
        let s = Settlement {
            id: "rsv_d".into(),
            scopes: who.scopes(),
            actual: one,
            overage: Default::default(),
            fresh: false,
        };
        assert!(q.settle(&budgets, s, called(&who, one)).await.unwrap());
        assert!(log.appended.lock().unwrap().is_empty());
        assert_eq!(budgets.get(&who.scopes()[0]).await.unwrap().used_tokens, 5);
    }

    /// A local log that takes the event is handed the reservation id as
    /// its delivery key and the settle to commit with it.
    #[tokio::test]
    async fn a_local_event_carries_the_reservation_as_its_key() {
        let budgets = GatewayStore::open_in_memory().await.unwrap();
        let log = Arc::new(FakeLog {
            known: vec!["ses_a".into()],
            ..Default::default()
        });
        let q = QueuedEvents::local(log.clone());
        let who = caller();
        let one = Amount {
            tokens: 5,
            usd_cents: 1,
        };
        let s = Settlement {
            id: "rsv_e".into(),
            scopes: who.scopes(),
            actual: one,
            overage: Default::default(),
            fresh: false,
        };
        // The fake runs no joined write: nothing fresh was recorded.
        assert!(!q.settle(&budgets, s, called(&who, one)).await.unwrap());
        let got = log.appended.lock().unwrap().clone();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].2.as_deref(), Some("rsv_e"));
        assert!(matches!(got[0].1, ModelEvent::Called { joined: None, .. }));
    }

    /// The local sink settles a call in one transaction with its event,
    /// the session's spend and the delivery key: once, however often it
    /// is asked, and a reservation settled before gets no event.
    #[tokio::test]
    async fn a_settled_call_commits_with_its_event_and_the_spend() {
        use hatchery_sessions::store::{DbSessionStore, SessionStore, LOCAL_HOST};
        let db = hatchery_db::Db::sqlite_memory().unwrap();
        let budgets = GatewayStore::open(db.clone()).await.unwrap();
        let store = Arc::new(DbSessionStore::open(db, LOCAL_HOST).await.unwrap());
        let fake = hatchery_sessions::sandbox::fake::FakeSandboxes::new();
        fake.add_template("code-interpreter");
        let sessions = Sessions::new(
            store.clone(),
            Default::default(),
            Arc::new(hatchery_sessions::policy::BuiltinPolicies),
            Arc::new(fake),
            Arc::new(hatchery_sessions::scheduler::LocalScheduler::new(2)),
        );
        let body = serde_json::from_value(
            serde_json::json!({"repo": "https://example.invalid/r.git", "task": "t"}),
        )
        .unwrap();
        let sid = sessions.create(body, None).await.unwrap().0.session_id;
        let q = QueuedEvents::local(Arc::new(sessions.clone()));
        let who = Caller {
            session: sid.clone(),
            tenant: None,
        };
        let scopes = who.scopes();
        let charged = Amount {
            tokens: 30,
            usd_cents: 2,
        };
        let called = || GatewayEvent::Called {
            caller: who.clone(),
            flavor: Flavor::OpenAi,
            model: "m".into(),
            input_tokens: Some(10),
            output_tokens: Some(20),
            charged,
            reserved: charged,
        };
        let settle = |id: &str| Settlement {
            id: id.into(),
            scopes: scopes.clone(),
            actual: charged,
            overage: Default::default(),
            fresh: false,
        };
        let count = |evs: &[hatchery_sessions::events::Event]| {
            evs.iter()
                .filter(|e| e.kind.type_name() == "model_call")
                .count()
        };
        let est = Amount {
            tokens: 100,
            usd_cents: 10,
        };
        for rsv in ["rsv_a", "rsv_b"] {
            budgets.reserve(rsv, &scopes, est, 0, 60_000).await.unwrap();
        }
        assert!(q.settle(&budgets, settle("rsv_a"), called()).await.unwrap());
        // Asked again (a retry): nothing more.
        assert!(!q.settle(&budgets, settle("rsv_a"), called()).await.unwrap());
        // Settled before, on its own: the joined settle declines and its
        // event rolls back with it.
        assert!(budgets.settle("rsv_b", &scopes, charged).await.unwrap());
        assert!(!q.settle(&budgets, settle("rsv_b"), called()).await.unwrap());
        let s = store.get(&sid).await.unwrap();
        assert_eq!((s.spend_tokens, s.spend_usd_cents), (30, 2));
        let evs = store.events(&sid, 0, 1000).await.unwrap();
        assert_eq!(count(&evs), 1, "one model_call event");
        let b = budgets.get(&scopes[0]).await.unwrap();
        assert_eq!(
            (b.used_tokens, b.used_usd_cents),
            (60, 4),
            "both settled once"
        );
    }
}
