//! What the gateway reports about calls. Sessions record these in their
//! event log; standalone, they are log lines, rate-limited because guest
//! code can cause them in a loop.

use crate::budget::Settlement;
use crate::budget::{Amount, BudgetError, BudgetStore, Caller};
use crate::usage::Flavor;
use std::sync::Mutex;
use std::time::Instant;

#[derive(Debug, Clone)]
pub enum GatewayEvent {
    /// A call about to reach the upstream, its worst case reserved (the
    /// intent, [`GatewayEvents::intent`]).
    Requested {
        caller: Caller,
        flavor: Flavor,
        model: String,
        reservation: String,
        reserved: Amount,
    },
    Called {
        caller: Caller,
        flavor: Flavor,
        model: String,
        input_tokens: Option<u64>,
        output_tokens: Option<u64>,
        charged: Amount,
        reserved: Amount,
    },
    Refused {
        caller: Option<Caller>,
        flavor: Flavor,
        code: &'static str,
        message: String,
    },
    Exhausted {
        caller: Caller,
        scope: String,
    },
    /// A reservation that outlived its call (the process serving it died)
    /// and was charged whole by the janitor: `charged` is zero when it
    /// had been settled before.
    Expired {
        caller: Caller,
        reservation: String,
        charged: Amount,
    },
    /// The upstream reported more than the call's reservation (an upper
    /// bound of what it could cost): `reported` is its figure, of which
    /// only `reserved` was charged (the `Called` event says so too).
    Overage {
        caller: Caller,
        flavor: Flavor,
        model: String,
        input_tokens: u64,
        output_tokens: u64,
        reported: Amount,
        reserved: Amount,
    },
}

#[async_trait::async_trait]
pub trait GatewayEvents: Send + Sync {
    fn record(&self, e: GatewayEvent);

    /// Records `e` before the caller is answered, for an event the caller
    /// acts on: an agent told its budget is spent exits at once, and the
    /// session must already know why (an effect is logged before it is
    /// seen). By default [`Self::record`]; a sink that writes somewhere
    /// waits for the write, within a bound of its own.
    async fn record_first(&self, e: GatewayEvent) {
        self.record(e)
    }

    /// Writes a call's intent (`Requested`) before the upstream is
    /// dialled: an error means it is not written and the call must not
    /// go out. By default [`Self::record`] (a gateway without session
    /// logs has nothing to refuse on).
    async fn intent(&self, e: GatewayEvent) -> Result<(), IntentError> {
        self.record(e);
        Ok(())
    }

    /// Settles a finished call's reservation and records its `Called`
    /// event. By default two steps: the settle commits, then the event is
    /// recorded. A sink that writes into a session log on the gateway's
    /// own database overrides this to commit the event, the session's
    /// spend and the settle in one transaction (hatchery-model-events' local sink).
    /// Returns whether the spend was recorded now (false: settled before).
    async fn settle(
        &self,
        store: &dyn BudgetStore,
        s: Settlement,
        called: GatewayEvent,
    ) -> Result<bool, BudgetError> {
        let r = store.settle_call(&s).await;
        self.record(called);
        r
    }
}

/// Why a call's intent was not written; the call is refused.
#[derive(Debug, thiserror::Error)]
pub enum IntentError {
    /// The session has ended: none of its calls goes out.
    #[error("the session has ended: its model calls are refused")]
    SessionEnded,
    /// The session's log could not take the intent (in time): the call
    /// does not go out unlogged.
    #[error("the session's log did not take the call's intent: {0}")]
    NotRecorded(String),
}

/// Log lines, at most `per_second` a second (the rest are counted and
/// reported with the next line that gets through).
pub struct LogEvents {
    per_second: u32,
    window: Mutex<(Instant, u32, u64)>,
}

impl LogEvents {
    pub fn new(per_second: u32) -> Self {
        LogEvents {
            per_second,
            window: Mutex::new((Instant::now(), 0, 0)),
        }
    }

    /// Whether a line may go out now, and how many were dropped before it.
    fn admit(&self) -> Option<u64> {
        let mut w = self.window.lock().unwrap_or_else(|p| p.into_inner());
        if w.0.elapsed().as_secs() >= 1 {
            *w = (Instant::now(), 0, w.2);
        }
        if w.1 >= self.per_second {
            w.2 += 1;
            return None;
        }
        w.1 += 1;
        Some(std::mem::take(&mut w.2))
    }
}

#[async_trait::async_trait]
impl GatewayEvents for LogEvents {
    /// No session log to write an intent to, and the settled call gets its
    /// own line: a second line per call would only eat into the limit.
    async fn intent(&self, _: GatewayEvent) -> Result<(), IntentError> {
        Ok(())
    }

    fn record(&self, e: GatewayEvent) {
        let Some(dropped) = self.admit() else { return };
        match e {
            GatewayEvent::Requested {
                caller,
                flavor,
                model,
                reservation,
                reserved,
            } => tracing::info!(session = %caller.session, ?flavor, %model, %reservation,
                reserved_tokens = reserved.tokens, reserved_cents = reserved.usd_cents, dropped,
                "model call sent to the upstream"),
            GatewayEvent::Called {
                caller,
                flavor,
                model,
                input_tokens,
                output_tokens,
                charged,
                reserved,
            } => tracing::info!(session = %caller.session, ?flavor, %model, ?input_tokens,
                ?output_tokens, charged_tokens = charged.tokens, charged_cents = charged.usd_cents,
                reserved_tokens = reserved.tokens, dropped, "model call"),
            GatewayEvent::Refused {
                caller,
                flavor,
                code,
                message,
            } => tracing::warn!(session = caller.as_ref().map(|c| c.session.as_str()), ?flavor,
                code, %message, dropped, "model call refused"),
            GatewayEvent::Expired {
                caller,
                reservation,
                charged,
            } => tracing::warn!(session = %caller.session, %reservation,
                charged_tokens = charged.tokens, charged_cents = charged.usd_cents, dropped,
                "an unsettled model call was charged its whole reservation"),
            GatewayEvent::Exhausted { caller, scope } => {
                tracing::warn!(session = %caller.session, %scope, dropped, "budget exhausted")
            }
            GatewayEvent::Overage {
                caller,
                flavor,
                model,
                input_tokens,
                output_tokens,
                reported,
                reserved,
            } => tracing::warn!(event = "overage", session = %caller.session,
                tenant = caller.tenant.as_deref(), ?flavor, %model, input_tokens, output_tokens,
                reported_tokens = reported.tokens, reported_cents = reported.usd_cents,
                reserved_tokens = reserved.tokens, reserved_cents = reserved.usd_cents, dropped,
                "model call overage: the upstream reported more than was reserved"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_rate_limited() {
        let l = LogEvents::new(3);
        let admitted = (0..10).filter(|_| l.admit().is_some()).count();
        assert_eq!(admitted, 3);
    }
}
