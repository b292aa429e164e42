//! The model gateway's observations into session logs. One conversion
//! (`model_event`) and two sinks: the gateway in this daemon writes to the
//! local sessions service; the control role's gateway posts each event to
//! the session's owning host (`POST /v1/sessions/{id}/model-events`), so
//! that it is written under that host's epoch like every other event.
//!
//! Delivery is exactly once: each event gets a delivery key when first
//! posted and keeps it on every retry, and the owner writes it with the
//! key in one transaction (SessionStore::append_once, in the shared
//! database), writing nothing for a key it has seen. So the control plane
//! retries any post that may not have been written (no connection, a
//! broken or unanswered one, a lost owner not yet replaced, a 409 from a
//! former owner) until its deadline; a doubled `model_call` would double
//! the spend, a lost one would under-count it.

use hatchery_gateway::budget::{BudgetError, BudgetStore};
use hatchery_gateway::events::{GatewayEvent, GatewayEvents};
use hatchery_gateway::store::Settlement;
use hatchery_sessions::events::cut;
use hatchery_sessions::model_events::{ModelEvent, MAX_MESSAGE};
use hatchery_sessions::owner_post::{Attempt, OwnerPost};
use hatchery_sessions::Sessions;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::mpsc;

/// Events waiting for their writer; past it they are dropped and counted,
/// never blocking a model call.
const EVENT_QUEUE: usize = 4096;
/// How long the control plane keeps trying to reach a session's owner: a
/// lost host's sessions are taken over within the lease TTL plus a sweep.
const DELIVERY_DEADLINE: Duration = Duration::from_secs(90);
const RETRY_EVERY: Duration = Duration::from_millis(500);

/// One rate-limited line for every event that does not reach a session's
/// log (guest code can cause them in a loop); `why` says where it stopped.
fn not_written(session: Option<&str>, why: &str) {
    static LIMIT: OnceLock<hatchery_core::ratelimit::LogLimiter> = OnceLock::new();
    let l =
        LIMIT.get_or_init(|| hatchery_core::ratelimit::LogLimiter::new(Duration::from_secs(10), 1));
    hatchery_core::limited_warn!(
        l,
        "gateway-event",
        session,
        why,
        "gateway event not written to the session log"
    );
}

/// The session a gateway event belongs to and what its log records; `None`
/// for events with no session to log to.
pub fn model_event(e: GatewayEvent) -> Option<(String, ModelEvent)> {
    match e {
        GatewayEvent::Called {
            caller,
            flavor,
            model,
            input_tokens,
            output_tokens,
            charged,
            ..
        } => Some((
            caller.session,
            ModelEvent::Called {
                api: flavor.name().into(),
                model: cut(&model, hatchery_sessions::model_events::MAX_MODEL).into(),
                input_tokens,
                output_tokens,
                tokens: charged.tokens,
                usd_cents: charged.usd_cents,
                joined: None,
            },
        )),
        // Its own event (and the end of the session) comes from
        // `Exhausted`, just before.
        GatewayEvent::Refused {
            code: "budget_exhausted",
            ..
        } => None,
        GatewayEvent::Refused {
            caller: Some(caller),
            flavor,
            code,
            message,
        } => Some((
            caller.session,
            ModelEvent::Refused {
                api: flavor.name().into(),
                code: code.into(),
                message: cut(&message, MAX_MESSAGE).into(),
            },
        )),
        // No caller: an unbound sandbox or a bad key; nothing to log it to.
        GatewayEvent::Refused { caller: None, .. } => None,
        GatewayEvent::Exhausted { caller, scope } => Some((
            caller.session,
            ModelEvent::Exhausted {
                scope,
                message: "a model call's worst case did not fit in what is left of the budget"
                    .into(),
            },
        )),
    }
}

/// Where converted events go.
#[async_trait::async_trait]
pub trait EventSink: Send + Sync + 'static {
    async fn deliver(&self, session: &str, e: ModelEvent);
}

/// What the writer task is handed: an observation, or a settled call's
/// event already carrying its settle (the control role's).
enum Queued {
    Observed(GatewayEvent),
    Settling(String, ModelEvent),
}

/// The gateway's [`GatewayEvents`]: a bounded queue to one writer task,
/// which delivers in the order the events happened.
pub struct QueuedEvents {
    tx: mpsc::Sender<Queued>,
    /// This daemon's sessions, on the gateway's own database: a settled
    /// call's event goes there in the settle's transaction, not through
    /// the queue.
    local: Option<Arc<Sessions>>,
}

impl QueuedEvents {
    /// The gateway beside this daemon's sessions, on the one database.
    pub fn local(sessions: Arc<Sessions>) -> Self {
        let mut q = Self::spawn(Arc::new(LocalSink(sessions.clone())));
        q.local = Some(sessions);
        q
    }

    pub fn spawn(sink: Arc<dyn EventSink>) -> Self {
        let (tx, mut rx) = mpsc::channel::<Queued>(EVENT_QUEUE);
        tokio::spawn(async move {
            while let Some(q) = rx.recv().await {
                let e = match q {
                    Queued::Observed(e) => model_event(e),
                    Queued::Settling(session, ev) => Some((session, ev)),
                };
                if let Some((session, ev)) = e {
                    sink.deliver(&session, ev).await;
                }
            }
        });
        QueuedEvents { tx, local: None }
    }
}

#[async_trait::async_trait]
impl GatewayEvents for QueuedEvents {
    fn record(&self, e: GatewayEvent) {
        if self.tx.try_send(Queued::Observed(e)).is_err() {
            not_written(None, "the gateway's event queue is full");
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
            return store.settle(&s.id, &s.scopes, s.actual).await;
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
            return store.settle(&s.id, &s.scopes, s.actual).await;
        };
        let key = s.id.clone();
        match sessions
            .record_model_event_joined(&session, ev, Some(&key), &mut s)
            .await
        {
            Ok(()) => Ok(s.fresh),
            Err(e) => {
                // Nothing of it committed; the spend still counts.
                tracing::debug!(session, error = %e, "gateway event not recorded");
                store.settle(&s.id, &s.scopes, s.actual).await
            }
        }
    }
}

/// This daemon's own sessions.
pub struct LocalSink(pub Arc<Sessions>);

#[async_trait::async_trait]
impl EventSink for LocalSink {
    async fn deliver(&self, session: &str, e: ModelEvent) {
        // In process: each event is handed over once, no key needed.
        if let Err(e) = self.0.record_model_event(session, e, None).await {
            // A caller that is no session of this host keeps no events.
            tracing::debug!(session, error = %e, "gateway event not recorded");
        }
    }
}

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

/// How a session's owning host reads the settle the control role's
/// gateway posts with a call's event: only of a reservation charged to
/// that session.
pub struct SettleDecoder;

impl hatchery_sessions::broker_hooks::RemoteJoined for SettleDecoder {
    fn decode(
        &self,
        session: &str,
        write: serde_json::Value,
    ) -> Result<Box<dyn hatchery_db::Joined>, String> {
        let s: Settlement = serde_json::from_value(write).map_err(|e| e.to_string())?;
        let own = format!("session:{session}");
        if !s.scopes.contains(&own) {
            return Err(format!("the settle is not charged to {own}"));
        }
        Ok(Box::new(s))
    }
}

#[async_trait::async_trait]
impl EventSink for RemoteSink {
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
        let deadline = tokio::time::Instant::now() + DELIVERY_DEADLINE;
        loop {
            let sent = self.post.attempt(session, "model-events", &key, &body);
            let (outcome, why) = match sent.await {
                Attempt::Delivered(_) => ("delivered", String::new()),
                Attempt::Retry(why) if tokio::time::Instant::now() < deadline => {
                    tracing::debug!(session, why, "gateway event: owner not reachable yet");
                    tokio::time::sleep(RETRY_EVERY).await;
                    continue;
                }
                Attempt::Retry(why) => ("timed_out", why),
                Attempt::Dropped(outcome, why) => (outcome, why),
            };
            self.outcomes.with_label_values(&[outcome]).inc();
            if outcome != "delivered" {
                not_written(Some(session), &format!("{outcome}: {why}"));
                self.settle_alone(session, &e).await;
            }
            return;
        }
    }
}

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
    use hatchery_gateway::budget::{Amount, Caller};
    use hatchery_gateway::usage::Flavor;
    use hatchery_route::{Directory, HostSlot, Location, RouteError};
    use hatchery_sessions::owner_post::SessionOwners;
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    fn caller() -> Caller {
        Caller {
            session: "ses_a".into(),
            tenant: None,
        }
    }

    #[test]
    fn events_convert_and_long_text_is_cut() {
        let (s, e) = model_event(GatewayEvent::Refused {
            caller: Some(caller()),
            flavor: Flavor::Anthropic,
            code: "upstream_unavailable",
            message: "é".repeat(MAX_MESSAGE),
        })
        .unwrap();
        assert_eq!(s, "ses_a");
        let ModelEvent::Refused { api, message, .. } = &e else {
            panic!("{e:?}")
        };
        assert_eq!(api, "anthropic");
        assert!(message.len() <= MAX_MESSAGE && message.len() > MAX_MESSAGE - 2);
        assert!(e.validate().is_ok());
        // The exhausted call's refusal is left to its `Exhausted` event.
        assert!(model_event(GatewayEvent::Refused {
            caller: Some(caller()),
            flavor: Flavor::OpenAi,
            code: "budget_exhausted",
            message: "m".into(),
        })
        .is_none());
        let (_, e) = model_event(GatewayEvent::Called {
            caller: caller(),
            flavor: Flavor::OpenAi,
            model: "m".into(),
            input_tokens: Some(1),
            output_tokens: Some(2),
            charged: Amount {
                tokens: 3,
                usd_cents: 4,
            },
            reserved: Amount {
                tokens: 9,
                usd_cents: 9,
            },
        })
        .unwrap();
        assert!(matches!(
            e,
            ModelEvent::Called {
                tokens: 3,
                usd_cents: 4,
                ..
            }
        ));
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
    struct Hosts(Vec<HostSlot>);
    #[async_trait::async_trait]
    impl Directory for Hosts {
        async fn sandbox(&self, _: &str) -> Result<Location, RouteError> {
            Ok(Location::Unknown)
        }
        async fn snapshot(&self, _: &str) -> Result<Location, RouteError> {
            Ok(Location::Unknown)
        }
        async fn session(&self, _: &str) -> Result<Location, RouteError> {
            Ok(Location::Unknown)
        }
        async fn hosts(&self) -> Result<Vec<HostSlot>, RouteError> {
            Ok(self.0.clone())
        }
        async fn tenant_live(&self, _: &str) -> Result<BTreeMap<String, u32>, RouteError> {
            Ok(BTreeMap::new())
        }
    }
    fn slot(id: &str, url: String, alive: bool) -> HostSlot {
        HostSlot {
            id: id.into(),
            url,
            capacity: 1,
            live: 0,
            alive,
            warm: vec![],
        }
    }
    fn sink(owners: Vec<Option<String>>, hosts: Vec<HostSlot>) -> RemoteSink {
        sink_of(owners, hosts, false)
    }
    fn sink_of(owners: Vec<Option<String>>, hosts: Vec<HostSlot>, ended: bool) -> RemoteSink {
        RemoteSink {
            post: OwnerPost {
                owners: Arc::new(Owners(Mutex::new(owners), ended)),
                directory: Arc::new(Hosts(hosts)),
                me: "ctl".into(),
                api_key: "k".into(),
                daemon_key: "dk".into(),
            },
            outcomes: outcomes(&prometheus::Registry::new()),
            budgets: None,
        }
    }

    /// The owner commits a posted settle only for a reservation charged to
    /// the session it is posted to.
    #[test]
    fn a_posted_settle_is_only_the_sessions_own() {
        use hatchery_sessions::broker_hooks::RemoteJoined;
        let s = |scopes: &[&str]| {
            serde_json::to_value(Settlement {
                id: "rsv_1".into(),
                scopes: scopes.iter().map(|x| x.to_string()).collect(),
                actual: Amount {
                    tokens: 3,
                    usd_cents: 1,
                },
                fresh: true,
            })
            .unwrap()
        };
        let own = s(&["session:ses_a", "tenant:t"]);
        assert!(own.get("fresh").is_none(), "{own}");
        assert!(SettleDecoder.decode("ses_a", own.clone()).is_ok());
        let e = SettleDecoder.decode("ses_b", own).err().unwrap();
        assert!(e.contains("session:ses_b"), "{e}");
        assert!(SettleDecoder.decode("ses_a", s(&["tenant:t"])).is_err());
        let junk = serde_json::json!({"id": "rsv_1", "scopes": ["session:ses_a"], "actual": {"tokens": 1, "usd_cents": 0}, "extra": 1});
        assert!(SettleDecoder.decode("ses_a", junk).is_err());
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

    /// The local sink settles a call in one transaction with its event,
    /// the session's spend and the delivery key: once, however often it
    /// is asked, and a reservation settled before gets no event.
    #[tokio::test]
    async fn a_settled_call_commits_with_its_event_and_the_spend() {
        use hatchery_gateway::store::GatewayStore;
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
        let sid = sessions.create(body).await.unwrap().0.session_id;
        let q = QueuedEvents::local(sessions.clone());
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

    /// Events the sink was handed.
    #[derive(Default)]
    struct Collect(Mutex<Vec<String>>, Mutex<Vec<ModelEvent>>);

    #[async_trait::async_trait]
    impl EventSink for Collect {
        async fn deliver(&self, session: &str, e: ModelEvent) {
            self.0.lock().unwrap().push(session.to_string());
            self.1.lock().unwrap().push(e);
        }
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
        let sink = Arc::new(Collect::default());
        let q = QueuedEvents::spawn(sink.clone());
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
        for _ in 0..200 {
            if !sink.0.lock().unwrap().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(*sink.0.lock().unwrap(), vec!["ses_a".to_string()]);
        let ev = sink.1.lock().unwrap().pop().unwrap();
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
        let mut remote = super::tests::sink(vec![None], vec![]);
        remote.budgets = Some(Arc::new(budgets.clone()));
        remote.deliver("ses_a", ev).await;
        let b = budgets.get(&who.scopes()[0]).await.unwrap();
        assert_eq!(b.used_tokens, 5);
    }
}
