//! Settling one call's reservation: what is charged (never more than was
//! reserved), what is reported when the upstream says it used more, and a
//! guard that charges the whole reservation when a call's settle would
//! otherwise never run (its task dropped or panicked).

use crate::budget::{Amount, Caller};
use crate::events::GatewayEvent;
use crate::pricing::Price;
use crate::usage::{Flavor, Reported};
use crate::Gateway;
use std::sync::Arc;
use std::time::Duration;

/// What the reservation's TTL leaves after a call's upstream exchange for
/// its settle to land while the reservation is still live.
pub const SETTLE_MARGIN: Duration = Duration::from_secs(30);

/// How long a call's upstream exchange (head and whole body, streamed or
/// not) may take from its reservation. Always shorter than the
/// reservation's TTL: the janitor must never drop a reservation whose call
/// is still running, or the budget would briefly not count it.
pub fn answer_deadline(reservation_ttl: Duration) -> Duration {
    reservation_ttl
        .saturating_sub(SETTLE_MARGIN)
        .max(reservation_ttl / 2)
}

/// The charge of a call that reported `reported` against a reservation of
/// `reserved`: at most the reservation, in each unit. The reservation was
/// an upper bound of everything the request could cost, so anything above
/// it is the upstream's error (or a lie) and is reported, not charged: a
/// budget passes its limit by at most what in-flight calls still hold.
pub fn cap(reported: Amount, reserved: Amount) -> Amount {
    Amount {
        tokens: reported.tokens.min(reserved.tokens),
        usd_cents: reported.usd_cents.min(reserved.usd_cents),
    }
}

/// Everything needed to settle one reservation. Dropped without
/// [`Settle::finish`] (a task cancelled or panicking between reserve and
/// settle), it charges the whole reservation from a task of its own: no
/// path leaves a reservation to expire uncharged.
pub struct Settle {
    inner: Option<Pending>,
}

struct Pending {
    g: Arc<Gateway>,
    id: String,
    scopes: Vec<String>,
    caller: Caller,
    flavor: Flavor,
    model: String,
    price: Price,
    estimate: Amount,
}

impl Settle {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        g: Arc<Gateway>,
        id: String,
        scopes: Vec<String>,
        caller: Caller,
        flavor: Flavor,
        model: String,
        price: Price,
        estimate: Amount,
    ) -> Self {
        Settle {
            inner: Some(Pending {
                g,
                id,
                scopes,
                caller,
                flavor,
                model,
                price,
                estimate,
            }),
        }
    }

    pub fn flavor(&self) -> Flavor {
        self.inner
            .as_ref()
            .map(|p| p.flavor)
            .unwrap_or(Flavor::OpenAi)
    }

    pub fn caller(&self) -> Option<&Caller> {
        self.inner.as_ref().map(|p| &p.caller)
    }

    pub fn gateway(&self) -> Option<&Arc<Gateway>> {
        self.inner.as_ref().map(|p| &p.g)
    }

    /// `used`: what the upstream reported, or None when it is not known
    /// (then the whole reservation is charged: it is an upper bound).
    pub async fn finish(mut self, used: Option<Reported>) {
        if let Some(p) = self.inner.take() {
            p.finish(used).await
        }
    }
}

impl Drop for Settle {
    fn drop(&mut self) {
        let Some(p) = self.inner.take() else { return };
        tracing::warn!(reservation = %p.id, "a model call ended without settling; charging its whole reservation");
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn(p.finish(None));
            }
            // No runtime (the process is shutting down): the janitor frees
            // the reservation after its TTL.
            Err(_) => {
                tracing::error!(reservation = %p.id, "no runtime to settle a dropped model call")
            }
        }
    }
}

impl Pending {
    async fn finish(self, used: Option<Reported>) {
        let g = self.g.clone();
        let reported = used.map(|u| u.amount(&self.price));
        let charged = reported.map_or(self.estimate, |r| cap(r, self.estimate));
        let over = reported.filter(|r| *r != cap(*r, self.estimate));
        let excess = over.map_or(Amount::default(), |r| Amount {
            tokens: r.tokens.saturating_sub(self.estimate.tokens),
            usd_cents: r.usd_cents.saturating_sub(self.estimate.usd_cents),
        });
        let called = GatewayEvent::Called {
            caller: self.caller.clone(),
            flavor: self.flavor,
            model: self.model.clone(),
            input_tokens: used.map(|u| u.input),
            output_tokens: used.map(|u| u.output),
            charged,
            reserved: self.estimate,
        };
        let settlement = crate::budget::Settlement {
            id: self.id.clone(),
            scopes: self.scopes.clone(),
            actual: charged,
            // Recorded with the charge, in its transaction: the next
            // reservation of any of these scopes already counts it.
            overage: excess,
            fresh: false,
        };
        if let Err(e) = g.events.settle(&*g.store, settlement, called).await {
            // The janitor frees the reservation after its TTL; the spend
            // of this call is then missing, which the log records.
            tracing::error!(reservation = %self.id, error = %e, "settling a model call failed");
        }
        if let (Some(reported), Some(u)) = (over, used) {
            self.overage(reported, excess, u).await;
        }
    }

    /// The upstream reported more than was reserved: an `overage` event
    /// with its figures, the metric, and when what it really spent leaves
    /// nothing of a scope's budget, that scope's exhaustion (in a session,
    /// the session ends `failed`, `budget_exhausted`). The excess itself
    /// was recorded with the settle, so the store already refuses the
    /// scope's next reservation whatever this reports.
    async fn overage(self, reported: Amount, excess: Amount, used: Reported) {
        let g = &self.g;
        g.metrics.overage(self.flavor, excess);
        g.events.record(GatewayEvent::Overage {
            caller: self.caller.clone(),
            flavor: self.flavor,
            model: self.model.clone(),
            input_tokens: used.input,
            output_tokens: used.output,
            reported,
            reserved: self.estimate,
        });
        for scope in &self.scopes {
            let b = match g.store.get(scope).await {
                Ok(b) => b,
                // A scope without a budget row is unlimited.
                Err(crate::budget::BudgetError::UnknownScope(_)) => continue,
                Err(e) => {
                    tracing::error!(%scope, error = %e, "reading a budget after an overage failed");
                    continue;
                }
            };
            // `b` counts this call's excess (and every earlier one's):
            // it was settled before this read.
            let gone = |limit: Option<u64>, used: u64, over: u64| {
                limit.is_some_and(|l| used.saturating_add(over) >= l)
            };
            if gone(b.limit_tokens, b.used_tokens, b.overage_tokens)
                || gone(b.limit_usd_cents, b.used_usd_cents, b.overage_usd_cents)
            {
                g.events.record(GatewayEvent::Exhausted {
                    caller: self.caller.clone(),
                    scope: scope.clone(),
                });
                // One is enough: it ends the session.
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::GatewayEvents;
    use crate::store::GatewayStore;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Recorded(Mutex<Vec<GatewayEvent>>);

    impl GatewayEvents for Recorded {
        fn record(&self, e: GatewayEvent) {
            self.0.lock().unwrap().push(e);
        }
    }

    async fn gateway(events: Arc<Recorded>) -> Arc<Gateway> {
        let s = Arc::new(GatewayStore::open_in_memory().await.unwrap());
        Arc::new(Gateway {
            store: s.clone(),
            keys: s,
            prices: Default::default(),
            openai: None,
            anthropic: None,
            max_output_tokens: 256,
            max_body: 1 << 16,
            reservation_ttl_ms: 300_000,
            trust_sandbox_header: false,
            admin_key: "k".repeat(16),
            metrics: Default::default(),
            events,
            policy: None,
        })
    }

    const PRICE: Price = Price {
        input_cents_per_mtok: 100_000,
        output_cents_per_mtok: 400_000,
    };

    /// Reserves `tokens` for session `ses_a` (limit 1,000 tokens) and
    /// returns its settle.
    async fn reserved(g: &Arc<Gateway>, tokens: u64) -> Settle {
        let scope = "session:ses_a".to_string();
        g.store.set_limits(&scope, Some(1_000), None).await.unwrap();
        let estimate = Amount {
            tokens,
            usd_cents: 100,
        };
        let id = format!("rsv_{}", rand::random::<u64>());
        g.store
            .reserve(
                &id,
                std::slice::from_ref(&scope),
                estimate,
                crate::now_ms(),
                300_000,
            )
            .await
            .unwrap();
        let caller = Caller {
            session: "ses_a".into(),
            tenant: None,
        };
        Settle::new(
            g.clone(),
            id,
            vec![scope],
            caller,
            Flavor::OpenAi,
            "m".into(),
            PRICE,
            estimate,
        )
    }

    async fn settled(g: &Arc<Gateway>) -> crate::budget::Budget {
        for _ in 0..200 {
            let b = g.store.get("session:ses_a").await.unwrap();
            if b.reserved_tokens == 0 {
                return b;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the reservation was never settled")
    }

    /// A call whose task is dropped between reserve and settle (a caller
    /// gone, a panic) is charged its whole reservation, not left to expire.
    #[tokio::test]
    async fn a_dropped_settle_charges_the_whole_reservation() {
        let ev = Arc::new(Recorded::default());
        let g = gateway(ev.clone()).await;
        let s = reserved(&g, 465).await;
        let task = tokio::spawn(async move {
            let _held = s;
            std::future::pending::<()>().await
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        task.abort();
        let b = settled(&g).await;
        assert_eq!((b.used_tokens, b.used_usd_cents), (465, 100));
        assert!(matches!(
            &ev.0.lock().unwrap()[..],
            [GatewayEvent::Called {
                input_tokens: None,
                ..
            }]
        ));
    }

    /// An upstream reporting 5,000 + 5,000 tokens for a call that reserved
    /// 465 is charged 465; the rest is an `overage` event and the metric,
    /// and the session's budget, really spent, is reported exhausted.
    #[tokio::test]
    async fn usage_above_the_reservation_is_an_overage_not_a_charge() {
        let ev = Arc::new(Recorded::default());
        let g = gateway(ev.clone()).await;
        let lie = Reported {
            input: 5_000,
            output: 5_000,
            cache_write: 0,
        };
        reserved(&g, 465).await.finish(Some(lie)).await;
        let b = settled(&g).await;
        assert_eq!((b.used_tokens, b.used_usd_cents), (465, 100));
        let tokens = g
            .metrics
            .overage_tokens
            .with_label_values(&["openai"])
            .get();
        assert_eq!(tokens, 10_000 - 465);
        let ev = ev.0.lock().unwrap();
        assert!(
            matches!(&ev[0], GatewayEvent::Called { charged, input_tokens: Some(5_000), .. }
            if charged.tokens == 465)
        );
        assert!(
            matches!(&ev[1], GatewayEvent::Overage { reported, reserved, .. }
            if reported.tokens == 10_000 && reserved.tokens == 465)
        );
        assert!(
            matches!(&ev[2], GatewayEvent::Exhausted { scope, .. } if scope == "session:ses_a")
        );
    }

    #[tokio::test]
    async fn an_honest_report_is_charged_as_reported() {
        let ev = Arc::new(Recorded::default());
        let g = gateway(ev.clone()).await;
        let honest = Reported {
            input: 100,
            output: 7,
            cache_write: 0,
        };
        reserved(&g, 465).await.finish(Some(honest)).await;
        let b = settled(&g).await;
        assert_eq!((b.used_tokens, b.used_usd_cents), (107, 13));
        assert_eq!(ev.0.lock().unwrap().len(), 1, "no overage, no exhaustion");
        assert_eq!(
            g.metrics
                .overage_tokens
                .with_label_values(&["openai"])
                .get(),
            0
        );
    }

    #[test]
    fn the_charge_never_exceeds_the_reservation() {
        let reserved = Amount {
            tokens: 465,
            usd_cents: 10,
        };
        let lie = Amount {
            tokens: 10_000,
            usd_cents: 3,
        };
        assert_eq!(
            cap(lie, reserved),
            Amount {
                tokens: 465,
                usd_cents: 3
            }
        );
        let honest = Amount {
            tokens: 100,
            usd_cents: 2,
        };
        assert_eq!(cap(honest, reserved), honest);
    }

    #[test]
    fn an_answer_ends_before_its_reservation_expires() {
        for s in [1, 2, 5, 30, 59, 60, 61, 120, 300, 3600] {
            let ttl = Duration::from_secs(s);
            let d = answer_deadline(ttl);
            assert!(d < ttl && d >= ttl / 2, "ttl {ttl:?}: {d:?}");
        }
        assert_eq!(
            answer_deadline(Duration::from_secs(300)),
            Duration::from_secs(270)
        );
    }
}
