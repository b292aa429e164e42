//! The control role's sink: each event posted to the session's owning
//! host, under one delivery key, until it is written or given up.

use crate::log_limit::not_written;
use crate::sink::EventSink;
use hatchery_gateway::budget::BudgetStore;
use hatchery_gateway::events::IntentError;
use hatchery_gateway::store::Settlement;
use hatchery_sessions::model_events::ModelEvent;
use hatchery_sessions::owner_post::{Attempt, OwnerPost};
use std::sync::Arc;
use std::time::Duration;

/// How long the control plane keeps trying to reach a session's owner: a
/// lost host's sessions are taken over within the lease TTL plus a sweep.
const DELIVERY_DEADLINE: Duration = Duration::from_secs(90);
const RETRY_EVERY: Duration = Duration::from_millis(500);

/// The control role's sink: each event posted to the session's owner.
pub struct RemoteSink {
    pub post: OwnerPost,
    pub outcomes: prometheus::IntCounterVec,
    /// Where a settle that travelled with an event that could not be
    /// delivered is made alone: the spend still counts.
    pub budgets: Option<Arc<dyn BudgetStore>>,
}

impl RemoteSink {
    /// A settle posted with an event that was not written: made here.
    async fn settle_alone(&self, session: &str, e: &ModelEvent) {
        let (
            Some(store),
            ModelEvent::Called {
                joined: Some(w), ..
            },
        ) = (&self.budgets, e)
        else {
            return;
        };
        match serde_json::from_value::<Settlement>(w.clone()) {
            Ok(s) => {
                if let Err(err) = store.settle(&s.id, &s.scopes, s.actual).await {
                    tracing::error!(session, reservation = %s.id, error = %err, "settling a model call failed");
                }
            }
            Err(err) => tracing::error!(session, error = %err, "a settle not readable"),
        }
    }
}

#[async_trait::async_trait]
impl EventSink for RemoteSink {
    async fn deliver_intent(&self, session: &str, e: ModelEvent) -> Result<(), IntentError> {
        self.post_intent(session, &e).await
    }

    async fn deliver(&self, session: &str, e: ModelEvent) {
        let body = match serde_json::to_vec(&e) {
            Ok(b) => b,
            Err(err) => {
                tracing::error!(session, error = %err, "gateway event not serializable");
                return;
            }
        };
        // One key per event, the same on every attempt: a settled call's
        // is its reservation id, as on one host.
        let key = match &e {
            ModelEvent::Called {
                joined: Some(w), ..
            } => w.get("id").and_then(|v| v.as_str()).map(str::to_string),
            _ => None,
        }
        .unwrap_or_else(|| format!("gw_{:032x}", rand::random::<u128>()));
        let (outcome, why) = self
            .post_until(session, &key, &body, DELIVERY_DEADLINE, RETRY_EVERY)
            .await;
        if outcome != "delivered" {
            not_written(Some(session), &format!("{outcome}: {why}"));
            self.settle_alone(session, &e).await;
        }
    }
}

impl RemoteSink {
    /// A call's intent posted to the owner and waited for, retried under
    /// one key (the reservation's, marked as the intent's) for at most
    /// [`INTENT_DEADLINE`]: a call waits that long at worst, and goes out
    /// only once its owner wrote the intent.
    async fn post_intent(&self, session: &str, e: &ModelEvent) -> Result<(), IntentError> {
        let ModelEvent::Requested { reservation, .. } = e else {
            return Err(IntentError::NotRecorded("not an intent".into()));
        };
        let body = serde_json::to_vec(e)
            .map_err(|err| IntentError::NotRecorded(format!("not serializable: {err}")))?;
        let key = format!("{reservation}_intent");
        match self
            .post_until(session, &key, &body, INTENT_DEADLINE, INTENT_RETRY_EVERY)
            .await
        {
            ("delivered", _) => Ok(()),
            ("session_ended", _) => Err(IntentError::SessionEnded),
            (_, why) => Err(IntentError::NotRecorded(why)),
        }
    }

    /// Posts `body` to `session`'s owner under `key`, again every `every`
    /// while the owner may yet take it, for at most `within`; counts and
    /// returns the outcome (`delivered`, `timed_out`, or why it was
    /// dropped) and why.
    async fn post_until(
        &self,
        session: &str,
        key: &str,
        body: &[u8],
        within: Duration,
        every: Duration,
    ) -> (&'static str, String) {
        let deadline = tokio::time::Instant::now() + within;
        let (outcome, why) = loop {
            match self.post.attempt(session, "model-events", key, body).await {
                Attempt::Delivered(_) => break ("delivered", String::new()),
                Attempt::Retry(why) if tokio::time::Instant::now() < deadline => {
                    tracing::debug!(session, why, "gateway event: owner not reachable yet");
                    tokio::time::sleep(every).await;
                }
                Attempt::Retry(why) => break ("timed_out", why),
                Attempt::Dropped(outcome, why) => break (outcome, why),
            }
        };
        self.outcomes.with_label_values(&[outcome]).inc();
        (outcome, why)
    }
}

/// How long a call waits for its intent to be written by the session's
/// owner before it is refused (503 `log_unavailable`).
const INTENT_DEADLINE: Duration = Duration::from_secs(5);
const INTENT_RETRY_EVERY: Duration = Duration::from_millis(100);

/// `hatchery_gateway_events_total{outcome}` on the control role.
pub fn outcomes(registry: &prometheus::Registry) -> prometheus::IntCounterVec {
    let c = prometheus::IntCounterVec::new(
        prometheus::Opts::new(
            "hatchery_gateway_events_total",
            "Model gateway events posted to the sessions' owning hosts, by outcome",
        ),
        &["outcome"],
    )
    .expect("valid metric");
    if let Err(e) = registry.register(Box::new(c.clone())) {
        tracing::warn!(error = %e, "gateway event metrics not registered");
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::fake::Collect;
    use crate::QueuedEvents;
    use hatchery_gateway::budget::{Amount, Caller};
    use hatchery_gateway::events::{GatewayEvent, GatewayEvents};
    use hatchery_gateway::usage::Flavor;
    use hatchery_route::fake::{slot, FixedHosts};
    use hatchery_route::HostSlot;
    use hatchery_sessions::owner_post::SessionOwners;
    use std::sync::Mutex;

    fn caller() -> Caller {
        Caller {
            session: "ses_a".into(),
            tenant: None,
        }
    }

    struct Owners(Mutex<Vec<Option<String>>>, bool);
    #[async_trait::async_trait]
    impl SessionOwners for Owners {
        async fn owner(
            &self,
            _: &str,
        ) -> Result<Option<(String, bool)>, hatchery_sessions::store::StoreError> {
            let mut v = self.0.lock().unwrap();
            let h = if v.len() > 1 {
                v.remove(0)
            } else {
                v[0].clone()
            };
            Ok(h.map(|h| (h, self.1)))
        }
    }
    fn sink(owners: Vec<Option<String>>, hosts: Vec<HostSlot>) -> RemoteSink {
        sink_of(owners, hosts, false)
    }
    fn sink_of(owners: Vec<Option<String>>, hosts: Vec<HostSlot>, ended: bool) -> RemoteSink {
        RemoteSink {
            post: OwnerPost {
                owners: Arc::new(Owners(Mutex::new(owners), ended)),
                directory: Arc::new(FixedHosts(hosts)),
                me: "ctl".into(),
                api_key: "k".into(),
                daemon_key: "dk".into(),
            },
            outcomes: outcomes(&prometheus::Registry::new()),
            budgets: None,
        }
    }

    /// A lost owner, a closed port and an owner that took the request and
    /// dropped the connection (it may have written: the key makes a second
    /// write a no-op) are retried; an unknown session or an ended one whose
    /// owner is lost is given up.
    #[tokio::test]
    async fn retries_and_what_is_given_up() {
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let s = sink(
            vec![Some("a".into())],
            vec![slot("a", format!("{closed}"), false)],
        );
        assert!(matches!(
            s.post.attempt("ses_a", "model-events", "k1", b"{}").await,
            Attempt::Retry(_)
        ));
        let s = sink(
            vec![Some("a".into())],
            vec![slot("a", format!("{closed}"), true)],
        );
        assert!(matches!(
            s.post.attempt("ses_a", "model-events", "k1", b"{}").await,
            Attempt::Retry(_)
        ));
        let s = sink(vec![None], vec![]);
        assert!(matches!(
            s.post.attempt("ses_a", "model-events", "k1", b"{}").await,
            Attempt::Dropped("unknown_session", _)
        ));
        // An ended session is never taken over: its lost owner is final.
        let s = sink_of(
            vec![Some("a".into())],
            vec![slot("a", format!("{closed}"), false)],
            true,
        );
        assert!(matches!(
            s.post.attempt("ses_a", "model-events", "k1", b"{}").await,
            Attempt::Dropped("owner_lost", _)
        ));

        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut c, _) = l.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let _ = tokio::io::AsyncReadExt::read(&mut c, &mut buf).await;
        });
        let s = sink(
            vec![Some("a".into())],
            vec![slot("a", format!("{addr}"), true)],
        );
        assert!(matches!(
            s.post.attempt("ses_a", "model-events", "k1", b"{}").await,
            Attempt::Retry(why) if why.starts_with("maybe sent")
        ));
    }

    /// The owner answers: the post carries the API key, a delivery key and
    /// the event, and a 409 (it no longer owns the session) sends it to the
    /// next owner under the same delivery key.
    #[tokio::test]
    async fn a_moved_session_is_posted_to_its_new_owner() {
        use axum::routing::post;
        let seen = Arc::new(Mutex::new(Vec::<String>::new()));
        let serve = |status: u16, seen: Arc<Mutex<Vec<String>>>| async move {
            let app = axum::Router::new().route(
                "/v1/sessions/{id}/model-events",
                post(move |h: axum::http::HeaderMap, body: String| async move {
                    let v = |n: &str| h.get(n).unwrap().to_str().unwrap().to_string();
                    let (auth, key) = (
                        v("authorization"),
                        v(hatchery_sessions::model_events::DELIVERY_HEADER),
                    );
                    seen.lock()
                        .unwrap()
                        .push(format!("{status} {auth} {key} {body}"));
                    axum::http::StatusCode::from_u16(status).unwrap()
                }),
            );
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
            addr
        };
        let old = serve(409, seen.clone()).await;
        let new = serve(204, seen.clone()).await;
        let s = sink(
            vec![Some("a".into()), Some("b".into())],
            vec![
                slot("a", format!("http://{old}"), true),
                slot("b", format!("http://{new}"), true),
            ],
        );
        let e = ModelEvent::Exhausted {
            scope: "session:ses_a".into(),
            message: "m".into(),
        };
        s.deliver("ses_a", e).await;
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 2, "{seen:?}");
        let key = seen[0].split(' ').nth(3).unwrap();
        assert!(key.starts_with("gw_") && key.len() == 35, "{seen:?}");
        assert!(
            seen[0].ends_with(
                " {\"kind\":\"exhausted\",\"scope\":\"session:ses_a\",\"message\":\"m\"}"
            ),
            "{seen:?}"
        );
        // The same delivery key on the retry to the new owner.
        assert!(
            seen[1].starts_with(&format!("204 Bearer k {key} ")),
            "{seen:?}"
        );
        assert_eq!(
            s.outcomes.with_label_values(&["delivered"]).get(),
            1,
            "delivered once"
        );
    }

    /// Without local sessions (the control role) a settled call's event
    /// still goes to the sink (ci16 caught it dropped: the owners' logs had
    /// no `model_call`), carrying its settle for the owner to commit with
    /// it; the settle is made here only when the event cannot be delivered.
    #[tokio::test]
    async fn without_local_sessions_the_event_still_goes_to_the_sink() {
        let budgets = hatchery_gateway::store::GatewayStore::open_in_memory()
            .await
            .unwrap();
        let collect = Arc::new(Collect::default());
        let q = QueuedEvents::spawn(collect.clone());
        let who = caller();
        let one = Amount {
            tokens: 5,
            usd_cents: 1,
        };
        budgets
            .reserve("rsv_c", &who.scopes(), one, 0, 60_000)
            .await
            .unwrap();
        let s = Settlement {
            id: "rsv_c".into(),
            scopes: who.scopes(),
            actual: one,
            overage: Default::default(),
            fresh: false,
        };
        let called = GatewayEvent::Called {
            caller: who.clone(),
            flavor: Flavor::OpenAi,
            model: "m".into(),
            input_tokens: Some(2),
            output_tokens: Some(3),
            charged: one,
            reserved: one,
        };
        assert!(q.settle(&budgets, s, called).await.unwrap());
        let (session, ev) = collect.until(1).await.pop().unwrap();
        assert_eq!(session, "ses_a");
        let ModelEvent::Called {
            joined: Some(w), ..
        } = &ev
        else {
            panic!("no settle travels with {ev:?}")
        };
        assert_eq!(w["id"], "rsv_c");
        // The owner's to commit, with the event: nothing settled here yet
        // (the scope has no row until a settle makes one).
        assert!(budgets.get(&who.scopes()[0]).await.is_err());
        // An owner that cannot take it (no such session): settled here
        // alone, the spend still counts.
        let mut remote = sink(vec![None], vec![]);
        remote.budgets = Some(Arc::new(budgets.clone()));
        remote.deliver("ses_a", ev).await;
        let b = budgets.get(&who.scopes()[0]).await.unwrap();
        assert_eq!(b.used_tokens, 5);
    }
}
