//! A host moving its sessions to other hosts (hatchery-sessions
//! `handoff`): when the operator drains it (`POST /v1/hosts/{id}:drain`,
//! seen here in the store's hold) and when it is told to stop (SIGTERM,
//! [`crate::graceful_stop`]). An uncordon ends a drain's shedding; a
//! stop's is never ended.
//!
//! It logs its progress: how many sessions are still here, every few
//! seconds, and when none is left.

use hatchery_sessions::error::SessionError;
use hatchery_sessions::handoff::{HandoffTargets, ShedReason};
use hatchery_sessions::Sessions;
use hatchery_store::{HostHold, Store};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// How often a shedding host looks at what is left, and wakes its
/// runners again when a target exists.
const TICK: Duration = Duration::from_millis(500);
/// How often runners that kept their session (no target then, or no
/// checkpoint) are woken to try again.
const NUDGE_EVERY: Duration = Duration::from_secs(2);
/// How often progress is logged.
const LOG_EVERY: Duration = Duration::from_secs(5);

/// Contract: what the shedder asks of this host's sessions
/// (hatchery-sessions `Sessions`).
#[async_trait::async_trait]
pub trait Shedding: Send + Sync {
    fn shed(&self, targets: Arc<dyn HandoffTargets>, why: ShedReason);
    fn unshed(&self);
    fn shedding(&self) -> bool;
    /// Unfinished sessions this host still owns.
    async fn owned(&self) -> Result<usize, SessionError>;
    fn halt(&self);
}

#[async_trait::async_trait]
impl Shedding for Arc<Sessions> {
    fn shed(&self, targets: Arc<dyn HandoffTargets>, why: ShedReason) {
        Sessions::shed(self, targets, why)
    }
    fn unshed(&self) {
        Sessions::unshed(self)
    }
    fn shedding(&self) -> bool {
        Sessions::shedding(self)
    }
    async fn owned(&self) -> Result<usize, SessionError> {
        Sessions::owned(self).await
    }
    fn halt(&self) {
        Sessions::halt(self)
    }
}

pub struct Shedder {
    pub sessions: Arc<dyn Shedding>,
    pub targets: Arc<dyn HandoffTargets>,
    pub store: Arc<dyn Store>,
    /// This host's id.
    pub me: String,
    /// Told to stop: a drain's end no longer ends the shedding.
    stopping: AtomicBool,
}

impl Shedder {
    pub fn new(
        sessions: Arc<dyn Shedding>,
        targets: Arc<dyn HandoffTargets>,
        store: Arc<dyn Store>,
        me: String,
    ) -> Arc<Shedder> {
        Arc::new(Shedder {
            sessions,
            targets,
            store,
            me,
            stopping: AtomicBool::new(false),
        })
    }

    /// Moves this host's sessions away until none is left or `deadline`
    /// passes; returns how many are left (they stay this host's: its next
    /// start resumes them, or, if it never comes back, the host-loss
    /// sweep moves them).
    pub async fn shed_until(&self, why: ShedReason, deadline: Instant) -> usize {
        if why == ShedReason::HostStopping {
            self.stopping.store(true, Ordering::SeqCst);
        }
        let started = Instant::now();
        let mut logged = started;
        let mut nudged: Option<Instant> = None;
        let mut left = self.left().await.unwrap_or(usize::MAX);
        tracing::info!(host = %self.me, sessions = left, reason = why.as_str(), "moving this host's sessions to other hosts");
        loop {
            if left == 0 {
                tracing::info!(host = %self.me, ms = started.elapsed().as_millis() as u64, reason = why.as_str(), "no sessions left on this host");
                return 0;
            }
            if Instant::now() >= deadline {
                tracing::warn!(host = %self.me, sessions = left, "sessions still on this host at the end of the grace; its next start resumes them");
                return left;
            }
            // Wakes runners that found no target before, once one exists.
            let due = match nudged {
                None => true,
                Some(t) => t.elapsed() >= NUDGE_EVERY,
            };
            if due && self.targets.pick().await.is_some() {
                self.sessions.shed(self.targets.clone(), why);
                nudged = Some(Instant::now());
            }
            tokio::time::sleep(TICK.min(deadline.saturating_duration_since(Instant::now()))).await;
            left = self.left().await.unwrap_or(left);
            if logged.elapsed() >= LOG_EVERY {
                logged = Instant::now();
                tracing::info!(host = %self.me, sessions = left, "moving sessions: still on this host");
            }
        }
    }

    async fn left(&self) -> Result<usize, SessionError> {
        self.sessions.owned().await.inspect_err(|e| {
            tracing::warn!(error = %e, "sessions left unknown: the session store did not answer");
        })
    }

    /// One look at this host's hold: a drain starts moving its sessions
    /// (until none is left), an uncordon stops it. Returns whether it
    /// sheds now.
    pub async fn check_hold(&self) -> bool {
        if self.stopping.load(Ordering::SeqCst) {
            return true;
        }
        let hold = match self.store.list_hosts().await {
            Ok(hosts) => hosts.into_iter().find(|h| h.id == self.me).map(|h| h.hold),
            Err(e) => {
                tracing::warn!(error = %e, "drain watch: the host list did not answer");
                return self.sessions.shedding();
            }
        };
        let draining = hold == Some(HostHold::Draining);
        match (draining, self.sessions.shedding()) {
            (true, false) => {
                tracing::info!(host = %self.me, "drained by the operator: moving this host's sessions to other hosts");
                self.sessions
                    .shed(self.targets.clone(), ShedReason::HostDraining);
            }
            (false, true) => {
                tracing::info!(host = %self.me, "drain ended: sessions stay on this host again");
                self.sessions.unshed();
            }
            (true, true) => {
                // Re-wakes runners that found no target before.
                if self.targets.pick().await.is_some() {
                    self.sessions
                        .shed(self.targets.clone(), ShedReason::HostDraining);
                }
            }
            (false, false) => {}
        }
        draining
    }

    /// [`Shedder::check_hold`] every `every`, logging a drain's progress.
    pub fn spawn_drain_watch(self: &Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            let mut last: Option<usize> = None;
            loop {
                tokio::time::sleep(every).await;
                if me.stopping.load(Ordering::SeqCst) {
                    return;
                }
                if !me.check_hold().await {
                    last = None;
                    continue;
                }
                let Ok(left) = me.sessions.owned().await else {
                    continue;
                };
                if last != Some(left) {
                    if left == 0 {
                        tracing::info!(host = %me.me, "drained: no sessions left on this host; it may be stopped");
                    } else {
                        tracing::info!(host = %me.me, sessions = left, "draining: sessions still on this host");
                    }
                    last = Some(left);
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct FixedTargets {
        host: Mutex<Option<String>>,
    }

    #[async_trait::async_trait]
    impl HandoffTargets for FixedTargets {
        async fn pick(&self) -> Option<String> {
            self.host.lock().unwrap().clone()
        }
    }

    /// Sessions that leave one per `shed` call while shedding.
    #[derive(Default)]
    struct FakeSessions {
        left: Mutex<usize>,
        shedding: Mutex<Option<ShedReason>>,
        sheds: Mutex<usize>,
    }

    #[async_trait::async_trait]
    impl Shedding for FakeSessions {
        fn shed(&self, _: Arc<dyn HandoffTargets>, why: ShedReason) {
            *self.shedding.lock().unwrap() = Some(why);
            *self.sheds.lock().unwrap() += 1;
            let mut l = self.left.lock().unwrap();
            *l = l.saturating_sub(1);
        }
        fn unshed(&self) {
            *self.shedding.lock().unwrap() = None;
        }
        fn shedding(&self) -> bool {
            self.shedding.lock().unwrap().is_some()
        }
        async fn owned(&self) -> Result<usize, SessionError> {
            Ok(*self.left.lock().unwrap())
        }
        fn halt(&self) {}
    }

    async fn store_with(me: &str, hold: HostHold) -> (Arc<dyn Store>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let db = hatchery_db::Db::sqlite(&dir.path().join("s.db"))
            .await
            .unwrap();
        let store: Arc<dyn Store> = Arc::new(hatchery_store::DbStore::open(db).await.unwrap());
        let lease = store
            .take_lease(&hatchery_store::host_resource(me), me, 30_000)
            .await
            .unwrap();
        let f = hatchery_store::Fence::of(&lease);
        store
            .register_host(&f, "127.0.0.1:1", 4, "t")
            .await
            .unwrap();
        store
            .hold_host(me, &HostHold::sources(hold), hold)
            .await
            .unwrap();
        (store, dir)
    }

    fn shedder(
        store: Arc<dyn Store>,
        sessions: Arc<FakeSessions>,
        to: Option<&str>,
    ) -> Arc<Shedder> {
        let targets = FixedTargets::default();
        *targets.host.lock().unwrap() = to.map(String::from);
        Shedder::new(sessions, Arc::new(targets), store, "h1".into())
    }

    #[tokio::test]
    async fn a_drain_sheds_and_an_uncordon_stops_it() {
        let (store, _d) = store_with("h1", HostHold::Draining).await;
        let sessions = Arc::new(FakeSessions::default());
        *sessions.left.lock().unwrap() = 5;
        let s = shedder(store.clone(), sessions.clone(), Some("h2"));
        assert!(s.check_hold().await);
        assert_eq!(
            *sessions.shedding.lock().unwrap(),
            Some(ShedReason::HostDraining)
        );
        store
            .hold_host("h1", &HostHold::sources(HostHold::None), HostHold::None)
            .await
            .unwrap();
        assert!(!s.check_hold().await);
        assert!(!sessions.shedding());
    }

    #[tokio::test]
    async fn a_stop_sheds_until_none_is_left_or_the_grace_ends() {
        let (store, _d) = store_with("h1", HostHold::None).await;
        let sessions = Arc::new(FakeSessions::default());
        *sessions.left.lock().unwrap() = 3;
        let s = shedder(store.clone(), sessions.clone(), Some("h2"));
        let left = s
            .shed_until(
                ShedReason::HostStopping,
                Instant::now() + Duration::from_secs(60),
            )
            .await;
        assert_eq!(left, 0);
        // Stopping: the operator's hold no longer ends it.
        assert!(s.check_hold().await);

        // Nowhere to go: nothing is handed, and the grace bounds the wait.
        *sessions.left.lock().unwrap() = 2;
        *sessions.sheds.lock().unwrap() = 0;
        let s = shedder(store, sessions.clone(), None);
        let t0 = Instant::now();
        let left = s
            .shed_until(ShedReason::HostStopping, t0 + Duration::from_secs(3))
            .await;
        assert_eq!((left, *sessions.sheds.lock().unwrap()), (2, 0));
        assert!(t0.elapsed() >= Duration::from_secs(3));
    }
}
