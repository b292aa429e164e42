//! What the daemon's gateway and egress proxy report back about a
//! session (hooks.rs plugs them in): model calls and their spend, refusals,
//! an exhausted budget, egress verdicts. Each is written as session events.
//! Apart from hooks.rs because these take [`Sessions`], which holds the
//! hooks: the traits stay below the service, these methods above it.

use crate::events::{Actor, Event, EventKind};
use crate::hooks::SessionHooks;
use crate::service::Sessions;
use crate::store::authorised::Authorised;
use crate::store::{Patch, Session, StoreError};
use std::sync::Arc;

impl Sessions {
    pub fn set_hooks(&self, hooks: Arc<dyn SessionHooks>) {
        self.core.set_hooks(hooks);
    }

    /// Host observations are written whatever the state: a call the
    /// gateway settles just after the agent finished was still spent, so it
    /// is recorded (after the final state change) rather than lost.
    async fn append_live(
        &self,
        id: &str,
        events: Vec<EventKind>,
        patch: Patch,
    ) -> Result<(), StoreError> {
        self.append_delivered(id, None, events, patch, &mut hatchery_db::Alone)
            .await
            .map(|_| ())
    }

    /// As `append_live`; with a delivery key (a sender in another process
    /// that may send the same write again), at most once per key
    /// (SessionStore::append_once). The events written now; None when the
    /// key had been seen.
    pub(crate) async fn append_delivered(
        &self,
        id: &str,
        key: Option<&str>,
        events: Vec<EventKind>,
        patch: Patch,
        joined: &mut dyn hatchery_db::Joined,
    ) -> Result<Option<Vec<Event>>, StoreError> {
        let events = events.into_iter().map(|k| (Actor::System, k)).collect();
        let evs = self
            .core
            .store
            .append_joined(id, key, events, patch, joined)
            .await?;
        if let Some(evs) = &evs {
            self.core.bus.publish(id, evs);
        }
        Ok(evs)
    }

    /// A settled model call: its event, the spend added in the same
    /// transaction, and the new totals. Once the first is committed the
    /// call is recorded: a failure of the totals event after it is logged,
    /// not returned, so that a caller that retries failures (the control
    /// role's gateway) never records the call twice.
    /// `joined`: the gateway's settle of the call, committed with the
    /// event and the spend (hatchery_db::Joined), or `Alone`.
    pub async fn record_model_call(
        &self,
        id: &str,
        call: EventKind,
        (tokens, usd_cents): (u64, u64),
        key: Option<&str>,
        joined: &mut dyn hatchery_db::Joined,
    ) -> Result<(), StoreError> {
        let spend = Patch {
            add_tokens: tokens,
            add_usd_cents: usd_cents,
            ..Default::default()
        };
        if self
            .append_delivered(id, key, vec![call], spend, joined)
            .await?
            .is_none()
        {
            // Sent again: recorded (with its totals) the first time.
            return Ok(());
        }
        let totals = async {
            let s = self.core.store.get(id).await?;
            self.append_live(
                id,
                vec![EventKind::Budget {
                    tokens: s.spend_tokens,
                    usd_cents: s.spend_usd_cents,
                    wall_s: crate::models::wall_s(&s),
                }],
                Patch::default(),
            )
            .await
        };
        if let Err(e) = totals.await {
            tracing::warn!(session = id, error = %e, "model call recorded; its budget event not");
        }
        Ok(())
    }

    /// A model call's intent (`model_call_intent`), committed only while the
    /// session is unfinished (checked in the same transaction): whether
    /// it is recorded. With a delivery key seen before it was recorded
    /// the first time, unless the session has ended since.
    pub async fn record_model_intent(
        &self,
        id: &str,
        intent: EventKind,
        key: Option<&str>,
    ) -> Result<bool, StoreError> {
        let mut authorised = Authorised {
            session: id,
            policy_version: None,
        };
        let written = self
            .append_delivered(id, key, vec![intent], Patch::default(), &mut authorised)
            .await?;
        if written.is_some() {
            return Ok(true);
        }
        // Nothing written: its key was seen (a retry of a recorded intent)
        // or the session has ended; only the second refuses the call.
        Ok(key.is_some() && !self.core.store.get(id).await?.state.is_terminal())
    }

    /// A refused model call (bad request, unbound, upstream down).
    pub async fn record_model_refused(
        &self,
        id: &str,
        api: &str,
        code: &str,
        message: &str,
        key: Option<&str>,
        joined: &mut dyn hatchery_db::Joined,
    ) -> Result<(), StoreError> {
        let refused = EventKind::ModelRefused {
            api: api.into(),
            code: code.into(),
            message: message.into(),
        };
        self.append_delivered(id, key, vec![refused], Patch::default(), joined)
            .await
            .map(|_| ())
    }

    /// The session's budget had no room for a call: the event now, and the
    /// runner ends the session `failed` (`budget_exhausted`).
    pub async fn record_budget_exhausted(
        self: &Arc<Self>,
        id: &str,
        scope: &str,
        message: &str,
        key: Option<&str>,
        joined: &mut dyn hatchery_db::Joined,
    ) -> Result<(), StoreError> {
        let exhausted = EventKind::BudgetExhausted {
            scope: scope.into(),
            message: message.into(),
        };
        // Sent again or not, the session is still out of budget: it ends
        // (again a no-op once it has).
        self.append_delivered(id, key, vec![exhausted], Patch::default(), joined)
            .await?;
        if self.core.store.get(id).await?.state.is_terminal() {
            return Ok(());
        }
        self.core.set_exhausted(id, format!("{scope}: {message}"));
        self.nudge(id);
        Ok(())
    }

    /// An egress connection's intent (`egress_connect`), committed only
    /// while the session is unfinished and on `policy_version` (checked in
    /// the same transaction): its seq, or `None` when that no longer holds
    /// (nothing written; the proxy refuses the connection).
    pub async fn record_egress_connect(
        &self,
        id: &str,
        intent: EventKind,
        policy_version: Option<u32>,
    ) -> Result<Option<u64>, StoreError> {
        let mut authorised = Authorised {
            session: id,
            policy_version,
        };
        let evs = self
            .append_delivered(id, None, vec![intent], Patch::default(), &mut authorised)
            .await?;
        Ok(evs.and_then(|e| e.first().map(|e| e.seq)))
    }

    /// An egress connection's outcome or a count of refusals
    /// (`egress_result`, `egress_denied`), whatever the session's state:
    /// what happened is recorded even after the session ended.
    pub async fn record_egress_event(&self, id: &str, e: EventKind) -> Result<(), StoreError> {
        self.append_live(id, vec![e], Patch::default()).await
    }

    /// Unfinished sessions that hold a sandbox: a restarted daemon binds
    /// them before its proxy takes connections, instead of waiting for each
    /// runner to re-attach.
    pub async fn holding_sandboxes(&self) -> Result<Vec<Session>, StoreError> {
        Ok(self
            .core
            .store
            .unfinished()
            .await?
            .into_iter()
            .filter(|s| s.sandbox_id.is_some())
            .collect())
    }

    /// The session as stored (the daemon's gateway and proxy read its
    /// pinned policy and budget from it).
    pub async fn session(&self, id: &str) -> Result<Session, StoreError> {
        self.core.store.get(id).await
    }
}
