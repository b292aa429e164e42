//! Anchoring: the latest head of each chain is written, periodically, to
//! write-once places outside the database, so rewriting the database
//! (even consistently, hashes recomputed) is caught by comparing with
//! what was anchored. The places are [`crate::sink`]s: an append-only file
//! (one JSON line per head, fsynced), an external command that receives
//! the same lines on stdin, an S3-compatible object store (a new object
//! per round; with object lock on the bucket, history the daemon cannot
//! rewrite).

use crate::sink::{AnchorSink, Batch, FileSink, HookSink};
use crate::store::AuditError;
use crate::verify::Head;
use prometheus::{IntCounterVec, Opts, Registry};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use crate::sink::hook::HOOK_TIMEOUT;

/// While a sink keeps failing, at most one log line per this long.
pub const FAILURE_LOG_EVERY: Duration = Duration::from_secs(60);

pub use crate::line::AnchorLine;

/// Anchoring's counters, by sink (`file`, `hook`, `s3`).
#[derive(Debug, Clone)]
pub struct AnchorMetrics {
    /// Batches a sink stored.
    pub anchored: IntCounterVec,
    /// Batches a sink failed to store (retried at the next round).
    pub failures: IntCounterVec,
}

impl Default for AnchorMetrics {
    fn default() -> Self {
        let vec = |name: &str, help: &str| {
            IntCounterVec::new(Opts::new(name, help), &["sink"]).expect("valid metric")
        };
        AnchorMetrics {
            anchored: vec(
                "hatchery_audit_anchors_total",
                "Batches of chain heads a sink stored",
            ),
            failures: vec(
                "hatchery_audit_anchor_failures_total",
                "Batches of chain heads a sink failed to store (retried next round)",
            ),
        }
    }
}

impl AnchorMetrics {
    pub fn register(&self, r: &Registry) -> prometheus::Result<()> {
        r.register(Box::new(self.anchored.clone()))?;
        r.register(Box::new(self.failures.clone()))
    }
}

/// The sinks heads are anchored to.
#[derive(Debug, Clone, Default)]
pub struct Anchor {
    pub sinks: Vec<Arc<dyn AnchorSink>>,
    pub metrics: AnchorMetrics,
}

impl Anchor {
    /// Anchoring to an append-only file.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Anchor::default().with(FileSink { path: path.into() })
    }

    /// Also to a hook command (argv).
    pub fn with_hook(self, argv: Vec<String>) -> Self {
        self.with(HookSink { argv })
    }

    pub fn with(mut self, sink: impl AnchorSink + 'static) -> Self {
        self.sinks.push(Arc::new(sink));
        self
    }

    /// Writes one line per head to every sink, in order; a failing sink
    /// does not stop the next. The first failure is the error.
    pub fn anchor(&self, heads: &[Head]) -> Result<(), AuditError> {
        if heads.is_empty() {
            return Ok(());
        }
        let batch = batch(heads, &crate::event::now_rfc3339());
        let mut first = None;
        for s in &self.sinks {
            if let Err(e) = self.put(s.as_ref(), &batch) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    fn put(&self, sink: &dyn AnchorSink, batch: &Batch) -> Result<(), AuditError> {
        let r = sink.put(batch);
        let m = match r {
            Ok(()) => &self.metrics.anchored,
            Err(_) => &self.metrics.failures,
        };
        m.with_label_values(&[sink.kind()]).inc();
        r.map_err(|source| AuditError::Sink {
            sink: sink.kind(),
            source,
        })
    }
}

/// The lines of `heads`, anchored `at` (one time per round: every sink
/// stores the same lines).
fn batch(heads: &[Head], at: &str) -> Batch {
    Batch::new(
        heads
            .iter()
            .map(|h| AnchorLine {
                anchored_at: at.to_string(),
                chain: h.chain.clone(),
                seq: h.seq,
                hash: h.hash.clone(),
            })
            .collect(),
    )
}

/// Every head ever anchored in the file, in file order. A malformed line is
/// an error: the file is append-only, so damage there is itself a finding.
pub fn read_anchors(path: &Path) -> Result<Vec<Head>, AuditError> {
    let err = |e| AuditError::Anchor(path.display().to_string(), e);
    let text = std::fs::read_to_string(path).map_err(err)?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            let a: AnchorLine = serde_json::from_str(l).map_err(|e| {
                AuditError::Invalid("anchor line", format!("{}:{}: {e}", path.display(), i + 1))
            })?;
            Ok(Head {
                chain: a.chain,
                seq: a.seq,
                hash: a.hash,
            })
        })
        .collect()
}

/// What the periodic task remembers of one sink.
#[derive(Debug, Clone, Default)]
struct SinkState {
    /// The seq of each chain's head this sink has stored.
    stored: HashMap<String, u64>,
    /// Failures since the last success, and when one was last logged.
    failing: u64,
    logged: Option<Instant>,
}

impl SinkState {
    /// Logs a failure: the first of a run, then at most once per
    /// [`FAILURE_LOG_EVERY`] (a store down for a day must not fill the
    /// log; the metric counts every one).
    fn failed(&mut self, sink: &str, e: &AuditError, now: Instant) {
        self.failing += 1;
        if self
            .logged
            .is_none_or(|t| now.duration_since(t) >= FAILURE_LOG_EVERY)
        {
            self.logged = Some(now);
            tracing::error!(sink, failures = self.failing, error = %ErrorChain(e),
                "audit anchoring failed; retrying next round");
        }
    }

    fn stored(&mut self, sink: &str, moved: &[Head]) {
        if self.failing > 0 {
            tracing::info!(sink, failures = self.failing, "audit anchoring works again");
        }
        self.failing = 0;
        self.logged = None;
        for m in moved {
            self.stored.insert(m.chain.clone(), m.seq);
        }
    }
}

/// An error with its sources, for a log line.
struct ErrorChain<'a>(&'a dyn std::error::Error);

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut s = self.0.source();
        while let Some(e) = s {
            write!(f, ": {e}")?;
            s = e.source();
        }
        Ok(())
    }
}

/// Anchors, every `interval`, the heads that moved since each sink last
/// stored them. `heads` reads them from the store (it runs on a blocking
/// thread). A sink that fails is counted, logged (rate-limited) and given
/// everything it still lacks at the next tick; the others go on.
pub fn spawn_periodic<F>(
    anchor: Anchor,
    interval: Duration,
    heads: F,
) -> tokio::task::JoinHandle<()>
where
    F: Fn() -> Result<Vec<Head>, AuditError> + Send + Sync + 'static,
{
    let heads = Arc::new(heads);
    let anchor = Arc::new(anchor);
    tokio::spawn(async move {
        let mut states = vec![SinkState::default(); anchor.sinks.len()];
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let (a, h) = (anchor.clone(), heads.clone());
            let seen = states.clone();
            let done = tokio::task::spawn_blocking(move || round(&a, &*h, seen)).await;
            match done {
                Ok(Ok(s)) => states = s,
                Ok(Err(e)) => {
                    tracing::error!(error = %ErrorChain(&e), "audit anchoring: reading the chain heads failed")
                }
                Err(e) => tracing::error!(error = %e, "audit anchoring task failed"),
            }
        }
    })
}

/// One round: each sink gets the heads it has not stored.
fn round(
    anchor: &Anchor,
    heads: &dyn Fn() -> Result<Vec<Head>, AuditError>,
    mut states: Vec<SinkState>,
) -> Result<Vec<SinkState>, AuditError> {
    let all = heads()?;
    let at = crate::event::now_rfc3339();
    for (sink, st) in anchor.sinks.iter().zip(states.iter_mut()) {
        let moved: Vec<Head> = all
            .iter()
            .filter(|x| st.stored.get(&x.chain) != Some(&x.seq))
            .cloned()
            .collect();
        if moved.is_empty() {
            continue;
        }
        match anchor.put(sink.as_ref(), &batch(&moved, &at)) {
            Ok(()) => st.stored(sink.kind(), &moved),
            Err(e) => st.failed(sink.kind(), &e, Instant::now()),
        }
    }
    Ok(states)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::FakeSink;
    use std::sync::atomic::Ordering;

    fn head(chain: &str, seq: u64) -> Head {
        Head {
            chain: chain.into(),
            seq,
            hash: format!("{seq:064x}"),
        }
    }

    #[test]
    fn a_failing_sink_is_retried_with_what_it_missed_and_the_others_go_on() {
        let (good, bad) = (Arc::new(FakeSink::default()), Arc::new(FakeSink::default()));
        bad.refuse.store(true, Ordering::SeqCst);
        let anchor = Anchor {
            sinks: vec![good.clone(), bad.clone()],
            metrics: AnchorMetrics::default(),
        };
        let now = std::sync::Mutex::new(vec![head("a", 1), head("b", 1)]);
        let heads = || Ok(now.lock().unwrap().clone());
        let s = round(&anchor, &heads, vec![SinkState::default(); 2]).unwrap();
        assert_eq!(good.got.lock().unwrap().len(), 1);
        assert_eq!(s[1].failing, 1);
        // Nothing moved: the good sink gets nothing, the bad one is retried.
        let s = round(&anchor, &heads, s).unwrap();
        assert_eq!(good.got.lock().unwrap().len(), 1);
        assert_eq!(s[1].failing, 2);
        let m = &anchor.metrics;
        assert_eq!(m.failures.with_label_values(&["fake"]).get(), 2);
        assert_eq!(m.anchored.with_label_values(&["fake"]).get(), 1);
        // It recovers and gets both chains; then only what moved.
        bad.refuse.store(false, Ordering::SeqCst);
        *now.lock().unwrap() = vec![head("a", 2), head("b", 1)];
        let s = round(&anchor, &heads, s).unwrap();
        let got = bad.got.lock().unwrap().clone();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].lines.len(), 2);
        let last = good.got.lock().unwrap().last().unwrap().clone();
        assert_eq!(
            last.lines
                .iter()
                .map(|l| (l.chain.as_str(), l.seq))
                .collect::<Vec<_>>(),
            vec![("a", 2)]
        );
        assert_eq!(s[1].failing, 0);
        assert_eq!(
            last.jsonl.lines().count(),
            1,
            "one JSON line per head: {}",
            last.jsonl
        );
    }

    #[test]
    fn failure_logs_are_rate_limited() {
        let mut st = SinkState::default();
        let e = AuditError::Heads("x".into());
        let t0 = Instant::now();
        st.failed("s3", &e, t0);
        assert_eq!(st.logged, Some(t0));
        st.failed("s3", &e, t0 + Duration::from_secs(59));
        assert_eq!(st.logged, Some(t0), "not logged again within a minute");
        st.failed("s3", &e, t0 + FAILURE_LOG_EVERY);
        assert_eq!(st.logged, Some(t0 + FAILURE_LOG_EVERY));
        assert_eq!(st.failing, 3);
        st.stored("s3", &[]);
        assert_eq!((st.failing, st.logged), (0, None));
    }
}
