//! What the session service and the runners both act through: the store,
//! the live bus, the sandboxes and scheduler, the daemon's hooks, the
//! config and the metrics, and the writes that go to the store first and
//! to live streams once committed. It knows nothing of runners, so the
//! runner (which drives one session through it) sits below the service
//! (which starts runners) instead of each importing the other.

use crate::bus::Bus;
use crate::config::SessionsConfig;
use crate::error::SessionError;
use crate::events::Event;
use crate::hooks::{NoHooks, SessionHooks};
use crate::metrics::SessionMetrics;
use crate::sandbox::Sandboxes;
use crate::scheduler::Scheduler;
use crate::state::SessionState;
use crate::store::{NewEvent, Patch, Session, SessionStore};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

pub struct SessionCore {
    pub(crate) store: Arc<dyn SessionStore>,
    pub(crate) bus: Bus,
    pub(crate) cfg: SessionsConfig,
    pub(crate) sandboxes: Arc<dyn Sandboxes>,
    pub(crate) scheduler: Arc<dyn Scheduler>,
    pub(crate) metrics: SessionMetrics,
    /// The daemon's gateway and egress proxy (hooks.rs).
    hooks: RwLock<Arc<dyn SessionHooks>>,
    /// Sessions whose budget the gateway found exhausted, for their runner.
    exhausted: Mutex<HashMap<String, String>>,
    /// Whether this host sheds its sessions to others (handoff.rs).
    pub(crate) handoff: crate::handoff::Handoff,
}

impl SessionCore {
    pub(crate) fn new(
        store: Arc<dyn SessionStore>,
        cfg: SessionsConfig,
        sandboxes: Arc<dyn Sandboxes>,
        scheduler: Arc<dyn Scheduler>,
    ) -> Self {
        SessionCore {
            store,
            bus: Bus::default(),
            cfg,
            sandboxes,
            scheduler,
            metrics: SessionMetrics::new(),
            hooks: RwLock::new(Arc::new(NoHooks)),
            exhausted: Mutex::new(HashMap::new()),
            handoff: Default::default(),
        }
    }

    pub(crate) fn set_hooks(&self, hooks: Arc<dyn SessionHooks>) {
        *self.hooks.write().unwrap_or_else(|p| p.into_inner()) = hooks;
    }

    pub(crate) fn hooks(&self) -> Arc<dyn SessionHooks> {
        self.hooks.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Notes that the gateway found session `id`'s budget exhausted
    /// (`why`), for its runner to end it.
    pub(crate) fn set_exhausted(&self, id: &str, why: String) {
        self.exhausted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.to_string(), why);
    }

    pub(crate) fn take_exhausted(&self, id: &str) -> Option<String> {
        self.exhausted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id)
    }

    pub(crate) async fn append(
        &self,
        id: &str,
        events: Vec<NewEvent>,
        patch: Patch,
    ) -> Result<Vec<Event>, SessionError> {
        let t = std::time::Instant::now();
        let out = self.store.append(id, events, patch).await?;
        self.metrics
            .append_seconds
            .observe(t.elapsed().as_secs_f64());
        self.bus.publish(id, &out);
        Ok(out)
    }

    /// [`Self::append`], only while the session is in one of `states`.
    pub(crate) async fn append_if_state(
        &self,
        id: &str,
        states: &[SessionState],
        events: Vec<NewEvent>,
        patch: Patch,
    ) -> Result<Vec<Event>, SessionError> {
        let out = self
            .store
            .append_if_state(id, states, events, patch)
            .await?;
        self.bus.publish(id, &out);
        Ok(out)
    }

    pub(crate) async fn transition(
        &self,
        id: &str,
        to: SessionState,
        reason: Option<String>,
        extra: Vec<NewEvent>,
        patch: Patch,
    ) -> Result<Session, SessionError> {
        let (s, evs) = self
            .store
            .transition(id, &SessionState::sources_of(to), to, reason, extra, patch)
            .await?;
        self.metrics
            .transitions
            .with_label_values(&[to.as_str()])
            .inc();
        self.bus.publish(id, &evs);
        Ok(s)
    }
}
