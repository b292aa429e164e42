//! Egress connection events into the session log.
//!
//! An allowed connection's intent (`egress_connect`) is committed before
//! the proxy dials, with a check in the same transaction that the session
//! is unfinished and still on the policy version that allowed it; if it
//! cannot be written in time the connection is refused, so nothing is
//! dialled unrecorded. Its `egress_result` (connected with bytes and
//! duration, refused, failed) is written when it ends.
//!
//! Refusals are what a looping or hostile guest can produce at will, so
//! they never wait: they are counted per session, source and destination
//! ([`coalesce`](super::coalesce)) and written by one task as
//! `egress_denied {count}` events, a handful whatever the guest does, with
//! every refusal in some count. The proxy's refusals are counted as they
//! happen; the kernel's (nftables, for connections that bypassed the
//! proxy) are read from the daemon's list of them ([`kernel`](super::kernel)).

use super::coalesce::{Batch, Coalescer, Dest, Sample, Source, MAX_DESTINATIONS};
use super::kernel;
use crate::events::EventKind;
use crate::sandbox::{KernelDenials, SandboxError};
use crate::store::StoreError;
use crate::Sessions;
use hatchery_egress::{CredentialResult, CredentialUse, EgressEvent, EgressResult, Events};
use hatchery_serve::limited_warn;
use hatchery_serve::log_limit::LogLimiter;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// How long an allowed connection may wait for its intent to be written.
const RECORD_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the writer looks for windows that ended.
const TICK: Duration = Duration::from_secs(1);

/// Why an allowed connection's intent was not written (the connection is
/// refused with this text).
#[derive(Debug, thiserror::Error)]
enum NotRecorded {
    #[error("no session")]
    NoSession,
    #[error("the session log refused the event")]
    Refused(#[source] StoreError),
    #[error("the session ended or moved to another policy version since the decision")]
    NotAuthorised,
    #[error("the session log did not answer in {} s", RECORD_TIMEOUT.as_secs())]
    TimedOut,
}

fn limiter() -> &'static LogLimiter {
    static L: OnceLock<LogLimiter> = OnceLock::new();
    L.get_or_init(|| LogLimiter::new(Duration::from_secs(10), 5))
}

/// Where egress events go: the session's event log. Implemented by
/// [`Sessions`]; the tests use a fake.
#[async_trait::async_trait]
pub trait EgressLog: Send + Sync + 'static {
    /// An `egress_connect`, committed only while the session is
    /// unfinished and on `policy_version`: its seq, or `None` when that no
    /// longer holds (nothing written).
    async fn record_connect(
        &self,
        session: &str,
        intent: EventKind,
        policy_version: Option<u32>,
    ) -> Result<Option<u64>, StoreError>;
    /// An `egress_result` or `egress_denied`, whatever the session's state.
    async fn record(&self, session: &str, e: EventKind) -> Result<(), StoreError>;
    /// The kernel's refusals of `sandbox` the daemon still keeps, and
    /// their exact total.
    async fn kernel_denials(&self, sandbox: &str) -> Result<KernelDenials, SandboxError>;
}

#[async_trait::async_trait]
impl EgressLog for Sessions {
    async fn record_connect(
        &self,
        session: &str,
        intent: EventKind,
        policy_version: Option<u32>,
    ) -> Result<Option<u64>, StoreError> {
        self.record_egress_connect(session, intent, policy_version)
            .await
    }
    async fn record(&self, session: &str, e: EventKind) -> Result<(), StoreError> {
        self.record_egress_event(session, e).await
    }
    async fn kernel_denials(&self, sandbox: &str) -> Result<KernelDenials, SandboxError> {
        self.core.sandboxes.kernel_denials(sandbox).await
    }
}

fn intent(e: EgressEvent) -> EventKind {
    EventKind::EgressConnect {
        host: e.host.unwrap_or_default(),
        port: e.port.unwrap_or_default(),
        ip: e.ip.map(|i| i.to_string()),
        decision: "allow".into(),
        rule_id: e.rule_id,
        policy_version: e.policy_version,
        approval_id: e.approval_id,
    }
}

fn outcome(r: EgressResult) -> EventKind {
    EventKind::EgressResult {
        connect_seq: r.intent,
        outcome: r.outcome.as_str().into(),
        status: r.status,
        reason: r.reason,
        bytes_up: r.bytes_up,
        bytes_down: r.bytes_down,
        duration_ms: r.duration.as_millis() as u64,
    }
}

fn denied(b: &Batch) -> EventKind {
    EventKind::EgressDenied {
        source: Some(b.dest.source.as_str().into()),
        host: b.dest.host.clone(),
        port: b.dest.port,
        ip: b.sample.ip.clone(),
        rule_id: b.sample.rule_id.clone(),
        status: b.dest.status,
        reason: b.sample.reason.clone(),
        count: b.count,
    }
}

/// The proxy's [`Events`]: intents written before the dial, results after,
/// refusals counted and written by one task.
pub struct SessionEvents {
    log: Arc<dyn EgressLog>,
    counts: Mutex<Coalescer>,
    /// Per bound sandbox (from [`SessionEvents::track_sandbox`] to
    /// [`SessionEvents::forget_sandbox`]): the last kernel refusal (`seq`)
    /// counted.
    kernel_seen: Mutex<HashMap<String, kernel::Cursor>>,
    wake: Arc<Notify>,
    /// Refusals that did not get an event of their own (in an
    /// `egress_denied` count with others).
    coalesced: prometheus::IntCounter,
    /// Refusals and results the log did not take (the session is gone).
    unrecorded: prometheus::IntCounter,
}

impl SessionEvents {
    /// Starts the writer of refusal counts: one `egress_denied` per
    /// source and destination per `interval`.
    pub fn start(
        log: Arc<dyn EgressLog>,
        registry: &prometheus::Registry,
        interval: Duration,
    ) -> Arc<SessionEvents> {
        Self::start_with(log, registry, interval, TICK)
    }

    fn start_with(
        log: Arc<dyn EgressLog>,
        registry: &prometheus::Registry,
        interval: Duration,
        tick: Duration,
    ) -> Arc<SessionEvents> {
        let coalesced = prometheus::IntCounter::new(
            "hatchery_egress_denied_coalesced_total",
            "Egress refusals written as part of another's egress_denied count instead of their own event",
        )
        .expect("metric");
        let unrecorded = prometheus::IntCounter::new(
            "hatchery_egress_events_unrecorded_total",
            "Egress refusals and results the session log did not take (the session is gone)",
        )
        .expect("metric");
        for c in [&coalesced, &unrecorded] {
            let _ = registry.register(Box::new(c.clone()));
        }
        let wake = Arc::new(Notify::new());
        let me = Arc::new(SessionEvents {
            log,
            counts: Mutex::new(Coalescer::new(interval, MAX_DESTINATIONS)),
            kernel_seen: Mutex::default(),
            wake: wake.clone(),
            coalesced,
            unrecorded,
        });
        // Holds only a weak reference while it waits: the daemon's
        // shutdown drops the proxy and, with it, the session service this
        // writes to; the writer ends then.
        let weak = Arc::downgrade(&me);
        tokio::spawn(async move {
            let mut t = tokio::time::interval(tick);
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = wake.notified() => {}
                    _ = t.tick() => {}
                }
                let Some(me) = weak.upgrade() else { break };
                let due = me.lock().due(Instant::now());
                me.write(due).await;
            }
        });
        me
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Coalescer> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes each batch; one the store fails on comes back to its count
    /// (written at its window's end), one whose session is gone is counted
    /// as unrecorded.
    async fn write(&self, batches: Vec<Batch>) {
        for b in batches {
            match self.log.record(&b.session, denied(&b)).await {
                Ok(()) => self.coalesced.inc_by(b.count - 1),
                Err(StoreError::NotFound(_)) => {
                    self.unrecorded.inc_by(b.count);
                    limited_warn!(limiter(), "egress-denied-gone", session = %b.session,
                        count = b.count, "egress refusals of a session that is gone not recorded");
                }
                Err(err) => {
                    limited_warn!(limiter(), "egress-denied", session = %b.session, error = %err,
                        count = b.count, "egress refusals not recorded yet; kept for the next interval");
                    self.lock().put_back(b, Instant::now());
                }
            }
        }
    }

    /// Writes what `session` counted, now: its sandbox is released (the
    /// session ended, went idle or moved), so nothing waits for a window.
    pub async fn flush_session(&self, session: &str) {
        let batches = self.lock().drain_session(session);
        self.write(batches).await;
    }

    /// The sandbox is bound: its kernel refusals are counted from now on
    /// (binding again, as after a restart, keeps the cursor).
    pub fn track_sandbox(&self, sandbox: &str) {
        self.kernel_seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(sandbox.to_string())
            .or_default();
    }

    /// Counts the kernel's refusals of `sandbox` (bound to `session`)
    /// logged since the last read. Two reads at once count each refusal
    /// once: what is new is decided under the lock, against the cursor;
    /// a read that ends after the sandbox was forgotten counts nothing.
    /// `last`: the sandbox is being released (its counter is read for
    /// the last time, kernel.rs).
    pub async fn poll_kernel(&self, sandbox: &str, session: &str, last: bool) {
        let list = match self.log.kernel_denials(sandbox).await {
            Ok(l) => l,
            // Deleted or lost: what it logged went with its slot.
            Err(SandboxError::NotFound(_)) => return,
            Err(err) => {
                limited_warn!(limiter(), "egress-kernel", sandbox = %sandbox, error = %err,
                    "the daemon's network events could not be read; read again next tick");
                return;
            }
        };
        let now = Instant::now();
        let mut wake = false;
        {
            let mut seen = self.kernel_seen.lock().unwrap_or_else(|p| p.into_inner());
            let Some(seen) = seen.get_mut(sandbox) else {
                return;
            };
            let (next, adds) = kernel::fold(*seen, &list, last);
            *seen = next;
            let mut c = self.lock();
            for (dest, sample, n) in adds {
                wake |= c.add(session, dest, sample, n, now);
            }
        }
        if wake {
            self.wake.notify_one();
        }
    }

    /// The sandbox is released: its cursor is dropped (a new sandbox of
    /// the session starts its own).
    pub fn forget_sandbox(&self, sandbox: &str) {
        self.kernel_seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(sandbox);
    }
}

#[async_trait::async_trait]
impl Events for SessionEvents {
    async fn connect(&self, e: EgressEvent) -> Result<u64, hatchery_egress::SourceError> {
        let Some(session) = e.session.clone() else {
            return Err(NotRecorded::NoSession.into());
        };
        let version = e.policy_version;
        let write = self.log.record_connect(&session, intent(e), version);
        match tokio::time::timeout(RECORD_TIMEOUT, write).await {
            Ok(Ok(Some(seq))) => Ok(seq),
            Ok(Ok(None)) => Err(NotRecorded::NotAuthorised.into()),
            Ok(Err(err)) => {
                limited_warn!(limiter(), "egress-record", session = %session,
                    error = %err, "an allowed egress connection could not be recorded; refused");
                Err(NotRecorded::Refused(err).into())
            }
            Err(_) => Err(NotRecorded::TimedOut.into()),
        }
    }

    async fn result(&self, r: EgressResult) {
        let session = r.session.clone();
        if let Err(err) = self.log.record(&session, outcome(r)).await {
            self.unrecorded.inc();
            limited_warn!(limiter(), "egress-result", session = %session, error = %err,
                "an egress connection's result could not be recorded");
        }
    }

    async fn credential(&self, u: CredentialUse) -> Result<u64, hatchery_egress::SourceError> {
        let session = u.session.clone();
        let version = u.policy_version;
        let e = EventKind::EgressCredential {
            connect_seq: u.connect_seq,
            secret: u.secret,
            rule_id: u.rule_id,
            host: u.host,
            port: u.port,
            method: u.method,
            path: u.path,
        };
        let write = self.log.record_connect(&session, e, version);
        match tokio::time::timeout(RECORD_TIMEOUT, write).await {
            Ok(Ok(Some(seq))) => Ok(seq),
            Ok(Ok(None)) => Err(NotRecorded::NotAuthorised.into()),
            Ok(Err(err)) => {
                limited_warn!(limiter(), "egress-credential", session = %session,
                    error = %err, "a credential's use could not be recorded; request refused");
                Err(NotRecorded::Refused(err).into())
            }
            Err(_) => Err(NotRecorded::TimedOut.into()),
        }
    }

    async fn credential_result(&self, r: CredentialResult) {
        let e = EventKind::EgressCredentialResult {
            credential_seq: r.use_seq,
            status: r.status,
            reason: r.reason,
        };
        if let Err(err) = self.log.record(&r.session, e).await {
            self.unrecorded.inc();
            limited_warn!(limiter(), "egress-credential-result", session = %r.session, error = %err,
                "a credential request's status could not be recorded");
        }
    }

    fn denied(&self, e: EgressEvent) {
        let Some(session) = e.session else {
            limited_warn!(limiter(), "egress-unknown", status = e.status,
                reason = %e.reason, "egress connection from no session refused");
            return;
        };
        let dest = Dest {
            source: Source::Proxy,
            host: e.host,
            port: e.port,
            status: e.status,
        };
        let sample = Sample {
            ip: e.ip.map(|i| i.to_string()),
            rule_id: e.rule_id,
            reason: e.reason,
        };
        if self.lock().add(&session, dest, sample, 1, Instant::now()) {
            self.wake.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hatchery_egress::{Outcome, Verdict};

    /// What the session log received; `gate` holds intents back until
    /// released, `refuse` fails every write, `unauthorised` declines
    /// intents.
    #[derive(Default)]
    struct FakeLog {
        written: Mutex<Vec<(String, EventKind)>>,
        gate: Option<tokio::sync::Semaphore>,
        refuse: bool,
        unauthorised: bool,
        /// The daemon's list of kernel refusals, as `kernel_denials` reads it.
        kernel: Mutex<Vec<crate::sandbox::KernelDenial>>,
        /// The slot's counter (`None`: a daemon that does not count).
        kernel_total: Mutex<Option<u64>>,
    }

    impl FakeLog {
        /// The kernel refuses `n` more attempts; the last 256 are kept.
        fn kernel_refuses(&self, n: u64) {
            let mut k = self.kernel.lock().unwrap();
            let last = k.last().map_or(0, |d| d.seq);
            k.extend(
                (last + 1..=last + n).map(|seq| crate::sandbox::KernelDenial {
                    seq,
                    protocol: "tcp".into(),
                    destination: "10.9.0.1".into(),
                    port: Some(7),
                }),
            );
            let over = k.len().saturating_sub(256);
            k.drain(..over);
        }
    }

    #[async_trait::async_trait]
    impl EgressLog for FakeLog {
        async fn record_connect(
            &self,
            session: &str,
            intent: EventKind,
            _: Option<u32>,
        ) -> Result<Option<u64>, StoreError> {
            if let Some(g) = &self.gate {
                g.acquire().await.expect("gate").forget();
            }
            if self.refuse {
                return Err(StoreError::Unavailable("fake".into()));
            }
            if self.unauthorised {
                return Ok(None);
            }
            let mut w = self.written.lock().unwrap();
            w.push((session.into(), intent));
            Ok(Some(w.len() as u64))
        }
        async fn record(&self, session: &str, e: EventKind) -> Result<(), StoreError> {
            if self.refuse {
                return Err(StoreError::Unavailable("fake".into()));
            }
            self.written.lock().unwrap().push((session.into(), e));
            Ok(())
        }
        async fn kernel_denials(&self, _: &str) -> Result<KernelDenials, SandboxError> {
            Ok(KernelDenials {
                list: self.kernel.lock().unwrap().clone(),
                total: *self.kernel_total.lock().unwrap(),
            })
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
            approval_id: None,
            status: if verdict == Verdict::Allowed {
                200
            } else {
                403
            },
            reason: "test".into(),
            policy_version: Some(1),
        }
    }

    fn events(log: &Arc<FakeLog>) -> Arc<SessionEvents> {
        SessionEvents::start(
            log.clone(),
            &prometheus::Registry::new(),
            super::super::coalesce::INTERVAL,
        )
    }

    #[tokio::test]
    async fn an_allowed_connection_waits_for_its_intent_and_gets_its_seq() {
        let log = Arc::new(FakeLog {
            gate: Some(tokio::sync::Semaphore::new(0)),
            ..FakeLog::default()
        });
        let ev = events(&log);
        let allowed = tokio::spawn({
            let ev = ev.clone();
            async move { ev.connect(event(Verdict::Allowed, Some("s1"))).await }
        });
        // The write is held back: the proxy is not told to go ahead.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!allowed.is_finished());
        assert!(log.written.lock().unwrap().is_empty());
        log.gate.as_ref().unwrap().add_permits(1);
        let seq = allowed.await.unwrap().expect("allowed once written");
        ev.result(EgressResult {
            session: "s1".into(),
            intent: seq,
            outcome: Outcome::Connected,
            status: 200,
            reason: "closed".into(),
            bytes_up: 3,
            bytes_down: 5,
            duration: Duration::from_millis(7),
        })
        .await;
        let w = log.written.lock().unwrap();
        assert!(
            matches!(&w[0].1, EventKind::EgressConnect { decision, policy_version: Some(1), .. } if decision == "allow")
        );
        assert!(
            matches!(&w[1].1, EventKind::EgressResult { connect_seq, outcome, bytes_up: 3, bytes_down: 5, duration_ms: 7, .. }
            if *connect_seq == seq && outcome == "connected")
        );
    }

    #[tokio::test]
    async fn an_allowed_connection_is_refused_when_its_intent_is_not_written() {
        for log in [
            FakeLog {
                refuse: true,
                ..FakeLog::default()
            },
            FakeLog {
                unauthorised: true,
                ..FakeLog::default()
            },
        ] {
            let log = Arc::new(log);
            let ev = events(&log);
            let err = ev
                .connect(event(Verdict::Allowed, Some("s1")))
                .await
                .expect_err("refused");
            let text = hatchery_serve::error_text::with_causes(&*err);
            assert!(
                text.contains("refused the event") || text.contains("policy version"),
                "{text}"
            );
            // Without a session there is no log to write to.
            assert!(ev.connect(event(Verdict::Allowed, None)).await.is_err());
            assert!(log.written.lock().unwrap().is_empty());
        }
    }

    /// Events over `log` whose windows last an hour (only a release or a
    /// flush writes past a destination's first refusal), ticking fast.
    fn hourly(log: &Arc<FakeLog>) -> Arc<SessionEvents> {
        SessionEvents::start_with(
            log.clone(),
            &prometheus::Registry::new(),
            Duration::from_secs(3600),
            Duration::from_millis(10),
        )
    }

    /// Refusals: the first of a destination is written at once, the rest
    /// at the window's end or when the session's sandbox is released, and
    /// the counts add up; the metric counts what shared an event.
    #[tokio::test]
    async fn refusals_are_counted_per_destination_and_flushed() {
        let log = Arc::new(FakeLog::default());
        let ev = hourly(&log);
        let count = |s: &str| -> (usize, u64) {
            let w = log.written.lock().unwrap();
            let c: Vec<u64> = w
                .iter()
                .filter(|(x, _)| x == s)
                .map(|(_, e)| match e {
                    EventKind::EgressDenied {
                        count, status: 403, ..
                    } => *count,
                    other => panic!("{other:?}"),
                })
                .collect();
            (c.len(), c.iter().sum())
        };
        let settle = || async {
            // The writer runs on this runtime: let it.
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        ev.denied(event(Verdict::Denied, Some("s1")));
        settle().await;
        // A destination's first refusal is written at once.
        assert_eq!(count("s1"), (1, 1));
        for _ in 0..999 {
            ev.denied(event(Verdict::Denied, Some("s1")));
        }
        ev.denied(event(Verdict::Denied, Some("s2")));
        // A refusal from no session is written nowhere.
        ev.denied(event(Verdict::Denied, None));
        settle().await;
        // The interval is an hour: the rest of s1 waits; s2's first is out.
        assert_eq!(count("s1"), (1, 1));
        assert_eq!(count("s2"), (1, 1));
        ev.flush_session("s1").await;
        assert_eq!(count("s1"), (2, 1000));
        assert_eq!(ev.coalesced.get(), 1000 - 2);
        assert_eq!(ev.lock().pending(), 0);
    }

    /// The kernel's refusals: read from the daemon's list each poll, each
    /// counted once however often it is read, a gap (more than 256 between
    /// two reads) counted under no destination, all written as
    /// `nftables` counts that add up to what the daemon logged.
    #[tokio::test]
    async fn kernel_refusals_are_counted_once_with_their_gaps() {
        let log = Arc::new(FakeLog::default());
        let ev = hourly(&log);
        log.kernel_refuses(5);
        // Not bound yet: nothing counted.
        ev.poll_kernel("sbx1", "s1", false).await;
        assert_eq!(ev.lock().pending(), 0);
        ev.track_sandbox("sbx1");
        ev.poll_kernel("sbx1", "s1", false).await;
        ev.poll_kernel("sbx1", "s1", false).await;
        // The writer runs on this runtime: let it write the first.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(log.written.lock().unwrap().len(), 1);
        log.kernel_refuses(300);
        // Two reads at once see the same list.
        tokio::join!(
            ev.poll_kernel("sbx1", "s1", false),
            ev.poll_kernel("sbx1", "s1", false)
        );
        // Bound again while bound (runners re-bind after a daemon
        // restart): the cursor stays where it was.
        ev.track_sandbox("sbx1");
        ev.poll_kernel("sbx1", "s1", false).await;
        ev.flush_session("s1").await;
        let w = log.written.lock().unwrap().clone();
        let mut total = 0;
        let mut gaps = 0;
        for (session, e) in w.iter() {
            let EventKind::EgressDenied {
                source,
                host,
                status,
                count,
                ..
            } = e
            else {
                panic!("{e:?}")
            };
            assert_eq!(
                (session.as_str(), source.as_deref(), *status),
                ("s1", Some("nftables"), 0)
            );
            if host.is_none() {
                gaps += count;
            }
            total += count;
        }
        assert_eq!(total, 305, "{w:?}");
        // Read up to 5; then 6..=305 logged and 50..=305 kept: 44 dropped.
        assert_eq!(gaps, 44);
        // One event at once (the first), then the rest at the flush: the
        // destination's and the gap's.
        assert_eq!(w.len(), 3, "{w:?}");
    }

    /// With the slot's counter, what the kernel did not log is counted
    /// too: after the release read, the `nftables` counts add up to the
    /// counter exactly.
    #[tokio::test]
    async fn kernel_refusals_add_up_to_the_slots_counter() {
        let log = Arc::new(FakeLog::default());
        let ev = hourly(&log);
        ev.track_sandbox("sbx1");
        for _ in 0..3 {
            // 40 logged, 960 past the log's rate limit, per tick.
            log.kernel_refuses(40);
            let logged = log.kernel.lock().unwrap().last().map_or(0, |d| d.seq);
            *log.kernel_total.lock().unwrap() = Some(logged * 25);
            ev.poll_kernel("sbx1", "s1", false).await;
        }
        ev.poll_kernel("sbx1", "s1", true).await;
        ev.forget_sandbox("sbx1");
        ev.flush_session("s1").await;
        let w = log.written.lock().unwrap().clone();
        let counted: u64 = w
            .iter()
            .map(|(_, e)| match e {
                EventKind::EgressDenied { count, .. } => *count,
                e => panic!("{e:?}"),
            })
            .sum();
        assert_eq!(counted, 3_000, "{w:?}");
        // A released sandbox's cursor is forgotten, and a read still under
        // way then (the periodic one) counts nothing again.
        ev.forget_sandbox("sbx1");
        assert!(ev.kernel_seen.lock().unwrap().is_empty());
        ev.poll_kernel("sbx1", "s1", false).await;
        assert_eq!(ev.lock().pending(), 0);
    }
}
