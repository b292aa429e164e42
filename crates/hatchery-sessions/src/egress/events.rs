//! Egress connection events into the session log.
//!
//! An allowed connection's event is written (committed) before a byte of
//! the connection reaches the upstream; if it cannot be written in time the
//! connection is refused, so no data leaves without its event.
//!
//! Denials are what a looping or hostile guest can produce at will, so
//! they never wait and are rate-limited per session: a bucket of
//! `DENY_BURST` refilled at `DENY_PER_SEC`; denials beyond it are counted
//! and written as one `egress_suppressed {denied: N}` event at most once a
//! second. The log stays bounded whatever the guest does, and the count
//! of what was not written one by one is never lost.

use crate::hooks::EgressRecord;
use crate::store::StoreError;
use crate::Sessions;
use hatchery_egress::{EgressEvent, Events, Verdict};
use hatchery_serve::limited_warn;
use hatchery_serve::log_limit::LogLimiter;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Denials written one by one in a burst, per session.
pub const DENY_BURST: f64 = 20.0;
/// Denials written one by one per second after the burst, per session.
pub const DENY_PER_SEC: f64 = 5.0;
/// How long an allowed connection may wait for its event to be written.
const RECORD_TIMEOUT: Duration = Duration::from_secs(5);

/// Why an allowed connection's event was not written (the connection is
/// refused with this text).
#[derive(Debug, thiserror::Error)]
enum NotRecorded {
    #[error("no session")]
    NoSession,
    #[error("the session log refused the event")]
    Refused(#[source] StoreError),
    #[error("the session log did not answer in {} s", RECORD_TIMEOUT.as_secs())]
    TimedOut,
}
/// Denials queued for writing (the writer is one task).
const QUEUE: usize = 8192;
/// How often suppressed counts are written.
const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// A session's bucket is forgotten after this long without a denial.
const FORGET_AFTER: Duration = Duration::from_secs(120);

fn limiter() -> &'static LogLimiter {
    static L: OnceLock<LogLimiter> = OnceLock::new();
    L.get_or_init(|| LogLimiter::new(Duration::from_secs(10), 5))
}

/// Where egress events go: the session's event log. Implemented by
/// [`Sessions`]; the tests use a fake.
///
/// Contract: `Ok` means the event is committed (an allowed connection
/// then carries data); an error means it is not, and the caller refuses
/// the connection or drops the denial.
#[async_trait::async_trait]
pub trait EgressLog: Send + Sync + 'static {
    /// One connection's verdict as a session event.
    async fn record_egress(&self, session: &str, r: EgressRecord) -> Result<(), StoreError>;
    /// `denied` denials not written one by one (over the rate limit).
    async fn record_egress_suppressed(&self, session: &str, denied: u64) -> Result<(), StoreError>;
}

#[async_trait::async_trait]
impl EgressLog for Sessions {
    async fn record_egress(&self, session: &str, r: EgressRecord) -> Result<(), StoreError> {
        Sessions::record_egress(self, session, r).await
    }
    async fn record_egress_suppressed(&self, session: &str, denied: u64) -> Result<(), StoreError> {
        Sessions::record_egress_suppressed(self, session, denied).await
    }
}

/// A per-session token bucket for denial events.
#[derive(Debug, Clone)]
struct Bucket {
    tokens: f64,
    at: Instant,
    suppressed: u64,
}

impl Bucket {
    fn new(now: Instant) -> Bucket {
        Bucket {
            tokens: DENY_BURST,
            at: now,
            suppressed: 0,
        }
    }

    /// Whether one more denial may be written now; counts it if not.
    fn take(&mut self, now: Instant) -> bool {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + dt * DENY_PER_SEC).min(DENY_BURST);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            self.suppressed += 1;
            false
        }
    }
}

/// Buckets by session; `flush` hands out the counts to write.
#[derive(Default)]
struct Buckets(Mutex<HashMap<String, Bucket>>);

impl Buckets {
    fn take(&self, session: &str, now: Instant) -> bool {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.entry(session.to_string())
            .or_insert_with(|| Bucket::new(now))
            .take(now)
    }

    /// Suppressed counts to write now (reset to zero), and buckets idle
    /// long enough (with nothing pending) forgotten.
    fn flush(&self, now: Instant) -> Vec<(String, u64)> {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = vec![];
        m.retain(|session, b| {
            if b.suppressed > 0 {
                out.push((session.clone(), std::mem::take(&mut b.suppressed)));
            }
            now.saturating_duration_since(b.at) < FORGET_AFTER
        });
        out
    }
}

fn record(e: EgressEvent) -> EgressRecord {
    EgressRecord {
        allowed: e.verdict == Verdict::Allowed,
        host: e.host,
        port: e.port,
        ip: e.ip.map(|i| i.to_string()),
        rule_id: e.rule_id,
        status: e.status,
        reason: e.reason,
    }
}

/// The proxy's [`Events`]: allowed connections written before they carry
/// data, denials rate-limited and written by one task.
pub struct SessionEvents {
    sessions: Arc<dyn EgressLog>,
    buckets: Arc<Buckets>,
    denials: mpsc::Sender<(String, EgressRecord)>,
    suppressed_total: prometheus::IntCounter,
}

impl SessionEvents {
    /// Starts the writer of denials and suppressed counts.
    pub fn start(
        sessions: Arc<dyn EgressLog>,
        registry: &prometheus::Registry,
    ) -> Arc<SessionEvents> {
        let suppressed_total = prometheus::IntCounter::new(
            "hatchery_egress_events_suppressed_total",
            "Egress denials not written one by one (over the per-session rate limit; counted in egress_suppressed events)",
        )
        .expect("metric");
        let _ = registry.register(Box::new(suppressed_total.clone()));
        let (tx, mut rx) = mpsc::channel::<(String, EgressRecord)>(QUEUE);
        let buckets: Arc<Buckets> = Arc::default();
        {
            let sessions = sessions.clone();
            let buckets = buckets.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(FLUSH_EVERY);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        got = rx.recv() => {
                            let Some((session, r)) = got else { break };
                            if let Err(err) = sessions.record_egress(&session, r).await {
                                tracing::debug!(session = %session, error = %err, "egress denial not recorded");
                            }
                        }
                        _ = tick.tick() => {
                            for (session, denied) in buckets.flush(Instant::now()) {
                                if let Err(err) = sessions.record_egress_suppressed(&session, denied).await {
                                    tracing::debug!(session = %session, error = %err, "egress suppressed count not recorded");
                                }
                            }
                        }
                    }
                }
            });
        }
        Arc::new(SessionEvents {
            sessions,
            buckets,
            denials: tx,
            suppressed_total,
        })
    }
}

#[async_trait::async_trait]
impl Events for SessionEvents {
    async fn allowed(&self, e: EgressEvent) -> Result<(), hatchery_egress::SourceError> {
        let Some(session) = e.session.clone() else {
            return Err(NotRecorded::NoSession.into());
        };
        match tokio::time::timeout(
            RECORD_TIMEOUT,
            self.sessions.record_egress(&session, record(e)),
        )
        .await
        {
            Ok(Ok(())) => Ok(()),
            Ok(Err(err)) => {
                limited_warn!(limiter(), "egress-record", session = %session,
                    error = %err, "an allowed egress connection could not be recorded; refused");
                Err(NotRecorded::Refused(err).into())
            }
            Err(_) => Err(NotRecorded::TimedOut.into()),
        }
    }

    fn denied(&self, e: EgressEvent) {
        let Some(session) = e.session.clone() else {
            limited_warn!(limiter(), "egress-unknown", status = e.status,
                reason = %e.reason, "egress connection from no session refused");
            return;
        };
        if !self.buckets.take(&session, Instant::now()) {
            self.suppressed_total.inc();
            return;
        }
        if self.denials.try_send((session, record(e))).is_err() {
            limited_warn!(
                limiter(),
                "egress-queue",
                "egress event queue full; denial not written to the session log"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_the_rate_then_counted() {
        let t0 = Instant::now();
        let mut b = Bucket::new(t0);
        let written = (0..100).filter(|_| b.take(t0)).count();
        assert_eq!(written, DENY_BURST as usize);
        assert_eq!(b.suppressed, 100 - DENY_BURST as u64);
        // One second later: DENY_PER_SEC more.
        let t1 = t0 + Duration::from_secs(1);
        let written = (0..100).filter(|_| b.take(t1)).count();
        assert_eq!(written, DENY_PER_SEC as usize);
        // Never more than the burst after a long quiet.
        let t2 = t1 + Duration::from_secs(3600);
        assert_eq!((0..100).filter(|_| b.take(t2)).count(), DENY_BURST as usize);
    }

    #[test]
    fn flush_hands_out_counts_once_and_forgets_idle_sessions() {
        let bs = Buckets::default();
        let t0 = Instant::now();
        for _ in 0..30 {
            bs.take("s1", t0);
        }
        bs.take("s2", t0);
        assert_eq!(bs.flush(t0), vec![("s1".to_string(), 10)]);
        assert_eq!(bs.flush(t0), vec![]);
        let later = t0 + FORGET_AFTER + Duration::from_secs(1);
        assert!(bs.flush(later).is_empty());
        assert!(bs.0.lock().unwrap().is_empty());
    }

    /// What the session log received; `gate` holds writes back until
    /// released, `refuse` fails them.
    #[derive(Default)]
    struct FakeLog {
        written: Mutex<Vec<(String, EgressRecord)>>,
        suppressed: Mutex<Vec<(String, u64)>>,
        gate: Option<tokio::sync::Semaphore>,
        refuse: bool,
    }

    #[async_trait::async_trait]
    impl EgressLog for FakeLog {
        async fn record_egress(&self, session: &str, r: EgressRecord) -> Result<(), StoreError> {
            if let Some(g) = &self.gate {
                g.acquire().await.expect("gate").forget();
            }
            if self.refuse {
                return Err(StoreError::Unavailable("fake".into()));
            }
            self.written.lock().unwrap().push((session.into(), r));
            Ok(())
        }
        async fn record_egress_suppressed(
            &self,
            session: &str,
            denied: u64,
        ) -> Result<(), StoreError> {
            self.suppressed
                .lock()
                .unwrap()
                .push((session.into(), denied));
            Ok(())
        }
    }

    fn event(verdict: Verdict, session: Option<&str>) -> EgressEvent {
        EgressEvent {
            verdict,
            session: session.map(str::to_string),
            peer: "0.0.0.0:0".parse().unwrap(),
            host: Some("example.com".into()),
            port: Some(443),
            ip: None,
            rule_id: None,
            status: if verdict == Verdict::Allowed {
                200
            } else {
                403
            },
            reason: "test".into(),
        }
    }

    fn events(log: &Arc<FakeLog>) -> Arc<SessionEvents> {
        SessionEvents::start(log.clone(), &prometheus::Registry::new())
    }

    #[tokio::test]
    async fn an_allowed_connection_waits_for_its_event() {
        let log = Arc::new(FakeLog {
            gate: Some(tokio::sync::Semaphore::new(0)),
            ..FakeLog::default()
        });
        let ev = events(&log);
        let allowed = tokio::spawn({
            let ev = ev.clone();
            async move { ev.allowed(event(Verdict::Allowed, Some("s1"))).await }
        });
        // The write is held back: the proxy is not told to go ahead.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!allowed.is_finished());
        assert!(log.written.lock().unwrap().is_empty());
        log.gate.as_ref().unwrap().add_permits(1);
        allowed.await.unwrap().expect("allowed once written");
        let w = log.written.lock().unwrap();
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].0, "s1");
        assert!(w[0].1.allowed);
    }

    #[tokio::test]
    async fn an_allowed_connection_is_refused_when_its_event_is_not_written() {
        let log = Arc::new(FakeLog {
            refuse: true,
            ..FakeLog::default()
        });
        let ev = events(&log);
        assert!(ev
            .allowed(event(Verdict::Allowed, Some("s1")))
            .await
            .is_err());
        // Without a session there is no log to write to.
        assert!(ev.allowed(event(Verdict::Allowed, None)).await.is_err());
        assert!(log.written.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn denials_over_the_rate_are_written_as_one_count() {
        let log = Arc::new(FakeLog::default());
        let ev = events(&log);
        for _ in 0..30 {
            ev.denied(event(Verdict::Denied, Some("s1")));
        }
        ev.denied(event(Verdict::Denied, Some("s2")));
        // A denial from no session is refused and written nowhere.
        ev.denied(event(Verdict::Denied, None));
        assert_eq!(ev.suppressed_total.get(), 30 - DENY_BURST as u64);
        // The writer's tick flushes counts once a second.
        let deadline = Instant::now() + Duration::from_secs(5);
        while log.suppressed.lock().unwrap().is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let w = log.written.lock().unwrap();
        assert_eq!(
            w.iter().filter(|(s, _)| s == "s1").count(),
            DENY_BURST as usize
        );
        assert_eq!(w.iter().filter(|(s, _)| s == "s2").count(), 1);
        assert!(w.iter().all(|(_, r)| !r.allowed));
        assert_eq!(
            *log.suppressed.lock().unwrap(),
            vec![("s1".to_string(), 30 - DENY_BURST as u64)]
        );
    }
}
