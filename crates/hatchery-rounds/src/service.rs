//! The rounds service: the store, the sandboxes it drives, its metrics, and
//! the per-session locks that keep a Run, a Submit and an End from
//! interleaving on one candidate's files.

use crate::sandbox::Sandboxes;
use crate::store::RoundStore;
use prometheus::{IntCounter, IntCounterVec, Opts, Registry};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct RoundsConfig {
    /// Base of the links handed out (`--public-url`); without it they are
    /// built from the request's `Host`.
    pub public_url: Option<String>,
    /// How often the reaper looks for closed replay windows and sessions
    /// past their length.
    pub reap_interval: Duration,
    /// Which rounds process this is (the daemon's host id), as labelled
    /// (`hatchery.rounds_by`) on the short-lived sandboxes it makes:
    /// graders, fresh Runs, preparations. At start it deletes only its own
    /// orphans, so processes sharing one database leave each other's be.
    pub process: String,
}

impl Default for RoundsConfig {
    fn default() -> Self {
        RoundsConfig {
            public_url: None,
            reap_interval: Duration::from_secs(30),
            process: "local".into(),
        }
    }
}

#[derive(Clone)]
pub struct Metrics {
    pub runs: IntCounterVec,
    pub gradings: IntCounterVec,
    pub sessions: IntCounter,
    pub replays_expired: IntCounter,
}

impl Metrics {
    pub fn new(reg: &Registry) -> Self {
        let runs = IntCounterVec::new(
            Opts::new(
                "hatchery_rounds_runs_total",
                "Runs of candidate code, by verdict",
            ),
            &["verdict"],
        )
        .expect("static metric");
        let gradings = IntCounterVec::new(
            Opts::new("hatchery_rounds_gradings_total", "Gradings, by status"),
            &["status"],
        )
        .expect("static metric");
        let sessions = IntCounter::new(
            "hatchery_rounds_sessions_created_total",
            "Candidate sessions created",
        )
        .expect("static metric");
        let replays_expired = IntCounter::new(
            "hatchery_rounds_replays_expired_total",
            "Replays deleted when their retention window closed",
        )
        .expect("static metric");
        // A second registration (tests building several services on one
        // registry) is not an error worth failing for.
        let _ = reg.register(Box::new(runs.clone()));
        let _ = reg.register(Box::new(gradings.clone()));
        let _ = reg.register(Box::new(sessions.clone()));
        let _ = reg.register(Box::new(replays_expired.clone()));
        Metrics {
            runs,
            gradings,
            sessions,
            replays_expired,
        }
    }
}

/// A session held by this process ([`Rounds::hold_session`]); dropped,
/// both locks go (the store's first).
pub(crate) struct SessionGuard {
    _store: crate::store::SessionHold,
    _local: tokio::sync::OwnedMutexGuard<()>,
}

pub struct Rounds {
    pub(crate) store: Arc<dyn RoundStore>,
    pub(crate) sandboxes: Arc<dyn Sandboxes>,
    pub(crate) api_key: Arc<str>,
    pub(crate) cfg: RoundsConfig,
    pub(crate) metrics: Metrics,
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// The live rooms this process keeps (src/room/).
    pub(crate) rooms: crate::room::Rooms,
    /// Resolves tenant keys ([`Rounds::set_tenants`]); unset, only the
    /// API key and the rounds' own tokens are let in.
    pub(crate) tenants: std::sync::OnceLock<Arc<hatchery_tenants::Tenants>>,
}

impl Rounds {
    pub fn new(
        store: Arc<dyn RoundStore>,
        sandboxes: Arc<dyn Sandboxes>,
        api_key: Arc<str>,
        cfg: RoundsConfig,
        registry: &Registry,
    ) -> Arc<Rounds> {
        Arc::new(Rounds {
            store,
            sandboxes,
            api_key,
            cfg,
            metrics: Metrics::new(registry),
            locks: Mutex::new(HashMap::new()),
            rooms: Default::default(),
            tenants: std::sync::OnceLock::new(),
        })
    }

    /// Lets tenant keys in: each reaches only the rounds it made (issue
    /// 36). Set once, at wiring; a second call is ignored.
    pub fn set_tenants(&self, tenants: Arc<hatchery_tenants::Tenants>) {
        let _ = self.tenants.set(tenants);
    }

    /// Holds one session's sandbox for a Run, a Submit's capture, a
    /// replay or the end: this process's lock first, then the store's
    /// (another control process on the same database). `wait = false`
    /// answers 409 `run_in_progress` at once while either is held.
    pub(crate) async fn hold_session(
        &self,
        session_id: &str,
        wait: bool,
    ) -> Result<SessionGuard, crate::RoundsError> {
        let busy = || {
            crate::RoundsError::state(
                "run_in_progress",
                "a Run or Submit of this session is in progress",
            )
        };
        let lock = self.session_lock(session_id);
        let local = if wait {
            lock.lock_owned().await
        } else {
            lock.try_lock_owned().map_err(|_| busy())?
        };
        let store = self
            .store
            .lock_session(session_id, wait)
            .await?
            .ok_or_else(busy)?;
        Ok(SessionGuard {
            _store: store,
            _local: local,
        })
    }

    /// This process's lock on one session (see [`Rounds::hold_session`]).
    fn session_lock(&self, session_id: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut g = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        // Forget locks nobody holds, so the map stays as small as the
        // number of sessions in use.
        if g.len() > 1024 {
            g.retain(|_, l| Arc::strong_count(l) > 1);
        }
        g.entry(session_id.to_string())
            .or_insert_with(|| Arc::new(tokio::sync::Mutex::new(())))
            .clone()
    }

    /// Metadata for a short-lived sandbox of this process: `pairs`
    /// (prefixed `hatchery.`) and the process's label.
    pub(crate) fn own_meta(
        &self,
        pairs: &[(&str, &str)],
    ) -> std::collections::BTreeMap<String, String> {
        let mut m = crate::session_ops::meta(pairs);
        m.insert("hatchery.rounds_by".into(), self.cfg.process.clone());
        m
    }

    pub(crate) fn base_url(&self, host: Option<&str>) -> String {
        match (&self.cfg.public_url, host) {
            (Some(u), _) => u.trim_end_matches('/').to_string(),
            (None, Some(h)) => format!("http://{h}"),
            (None, None) => String::new(),
        }
    }

    /// Runs the reaper until the returned handle is dropped or aborted.
    pub fn spawn_reaper(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            // Once, at start: gradings a previous process did not finish.
            match me.resume_gradings().await {
                Ok(0) => {}
                Ok(n) => tracing::info!(n, "rounds: resumed gradings cut off by a restart"),
                Err(e) => tracing::warn!(error = %e, "rounds: resuming gradings failed"),
            }
            let mut tick = tokio::time::interval(me.cfg.reap_interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                me.reap_once().await;
            }
        })
    }
}
