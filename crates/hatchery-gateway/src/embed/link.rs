//! The running embedded gateway, as the daemon's session hooks use it:
//! a sandbox's calls charged to its session, within the session's budget.

use crate::budget::{BudgetError, BudgetStore, Caller, Expired, KeyStore};
use crate::events::{GatewayEvent, GatewayEvents};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How often [`GatewayLink::settle_calls`] looks again.
const SETTLE_POLL: Duration = Duration::from_millis(50);

pub struct GatewayLink {
    pub store: Arc<dyn BudgetStore>,
    pub keys: Arc<dyn KeyStore>,
    /// Where sandboxes reach it on their loopback.
    pub guest_port: u16,
    /// The Unix socket the daemon registers as that host service.
    pub socket: PathBuf,
    /// How long [`GatewayLink::settle_calls`] waits: a call in flight ends
    /// (settled, or charged its whole reservation) within the answer
    /// deadline, which this is a little over.
    pub settle_within: std::time::Duration,
    /// Where a session's calls charged whole at its end are reported
    /// (`Expired`, to the session's log, as the janitor reports its own).
    /// `None` on a host relaying to the control role: the calls are the
    /// control role's gateway's; the session's end logs what was charged.
    pub events: Option<Arc<dyn GatewayEvents>>,
}

/// A session's tenant and its limits, as a second budget scope its
/// calls reserve against (issue 36). `None` limits: unlimited in that unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantScope {
    pub id: String,
    pub tokens: Option<u64>,
    pub usd_cents: Option<u64>,
}

impl GatewayLink {
    /// Charges `sandbox`'s calls to `session`, within its budget
    /// (`usd_cents` 0: no limit in cents), and, for a tenant's session,
    /// within the tenant's limits too: each call reserves against both
    /// scopes in one transaction.
    pub async fn bind(
        &self,
        session: &str,
        sandbox: &str,
        (tokens, usd_cents): (u64, u64),
        tenant: Option<&TenantScope>,
    ) -> Result<(), BudgetError> {
        let scope = format!("session:{session}");
        self.store
            .set_limits(&scope, Some(tokens), (usd_cents > 0).then_some(usd_cents))
            .await?;
        if let Some(t) = tenant {
            // The tenant's current limits (a PATCH since the last bind
            // applies from this one on); what it spent stays.
            self.store
                .set_limits(&format!("tenant:{}", t.id), t.tokens, t.usd_cents)
                .await?;
        }
        self.keys
            .bind_sandbox(
                sandbox,
                &Caller {
                    session: session.to_string(),
                    tenant: tenant.map(|t| t.id.clone()),
                },
            )
            .await
    }

    /// Waits until no call of `session` is in flight (each settled, its
    /// spend committed with its `model_call` event), up to
    /// `settle_within`. Called when a session ends, after its sandbox was
    /// unbound (so no new call starts), before its final spend is
    /// reported. A call still open then (its process died or hangs past
    /// the answer deadline) is charged its whole reservation now, as the
    /// janitor would at its TTL, so that the final spend counts it
    /// (issue 36); those are returned.
    pub async fn settle_calls(&self, session: &str) -> Result<Vec<Expired>, BudgetError> {
        let scope = format!("session:{session}");
        let deadline = tokio::time::Instant::now() + self.settle_within;
        loop {
            if self.store.open_reservations(&scope).await? == 0 {
                return Ok(vec![]);
            }
            if tokio::time::Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(SETTLE_POLL).await;
        }
        let charged = self.store.charge_open(&scope).await?;
        if let Some(events) = &self.events {
            for e in &charged {
                if let Some(caller) = e.caller() {
                    events.record(GatewayEvent::Expired {
                        caller,
                        reservation: e.id.clone(),
                        charged: e.charged,
                    });
                }
            }
        }
        Ok(charged)
    }

    /// Its calls are nobody's any more (a failure is logged: the binding
    /// is replaced when the sandbox id is bound again).
    pub async fn unbind(&self, sandbox: &str) {
        if let Err(e) = self.keys.unbind_sandbox(sandbox).await {
            tracing::warn!(sandbox, error = %e, "gateway unbind failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::GatewayStore;

    #[tokio::test]
    async fn a_bound_sandbox_is_charged_to_its_session_within_its_budget() {
        let s = Arc::new(GatewayStore::open_in_memory().await.unwrap());
        let link = GatewayLink {
            store: s.clone(),
            keys: s.clone(),
            guest_port: 9100,
            socket: PathBuf::from("/nonexistent"),
            settle_within: Duration::from_millis(300),
            events: None,
        };
        link.bind("ses_a", "sbx_1", (1000, 0), None).await.unwrap();
        let who = s.caller_of_sandbox("sbx_1").await.unwrap().unwrap();
        assert_eq!(who.session, "ses_a");
        let b = s.get("session:ses_a").await.unwrap();
        assert_eq!((b.limit_tokens, b.limit_usd_cents), (Some(1000), None));
        link.bind("ses_a", "sbx_1", (1000, 25), None).await.unwrap();
        let b = s.get("session:ses_a").await.unwrap();
        assert_eq!(b.limit_usd_cents, Some(25));
        // A tenant's session: its calls are the tenant's too, within the
        // tenant's limits.
        let t = TenantScope {
            id: "ten_a".into(),
            tokens: Some(5000),
            usd_cents: None,
        };
        link.bind("ses_a", "sbx_1", (1000, 25), Some(&t))
            .await
            .unwrap();
        let who = s.caller_of_sandbox("sbx_1").await.unwrap().unwrap();
        assert_eq!(who.tenant.as_deref(), Some("ten_a"));
        assert_eq!(who.scopes(), ["session:ses_a", "tenant:ten_a"]);
        let b = s.get("tenant:ten_a").await.unwrap();
        assert_eq!((b.limit_tokens, b.limit_usd_cents), (Some(5000), None));
        link.unbind("sbx_1").await;
        assert!(s.caller_of_sandbox("sbx_1").await.unwrap().is_none());
        // Twice: nothing to unbind, nothing fails.
        link.unbind("sbx_1").await;
    }

    #[tokio::test]
    async fn settle_calls_waits_for_the_session_s_calls_in_flight() {
        use crate::budget::Amount;
        let s = Arc::new(GatewayStore::open_in_memory().await.unwrap());
        let link = Arc::new(GatewayLink {
            store: s.clone(),
            keys: s.clone(),
            guest_port: 9100,
            socket: PathBuf::from("/nonexistent"),
            settle_within: Duration::from_secs(5),
            events: None,
        });
        assert!(link.settle_calls("ses_a").await.unwrap().is_empty());
        let scopes = vec!["session:ses_a".to_string()];
        let est = Amount {
            tokens: 100,
            usd_cents: 0,
        };
        let now = crate::now_ms();
        s.reserve("call_1", &scopes, est, now, 60_000)
            .await
            .unwrap();
        // Settled 200 ms from now, while settle_calls waits.
        let (s2, sc) = (s.clone(), scopes.clone());
        let settler = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let used = Amount {
                tokens: 40,
                usd_cents: 0,
            };
            s2.settle("call_1", &sc, used).await.unwrap();
        });
        let t = tokio::time::Instant::now();
        assert!(link.settle_calls("ses_a").await.unwrap().is_empty());
        assert!(t.elapsed() >= Duration::from_millis(150));
        settler.await.unwrap();
        assert_eq!(s.get("session:ses_a").await.unwrap().used_tokens, 40);
        // One never settled (its process died), of a tenant's session:
        // after settle_within it is charged its whole reservation on both
        // scopes, so the final spend counts it; a late settle adds nothing.
        let both = vec!["session:ses_a".to_string(), "tenant:ten_a".to_string()];
        s.reserve("call_2", &both, est, now, 60_000).await.unwrap();
        let short = GatewayLink {
            settle_within: Duration::from_millis(120),
            ..Arc::try_unwrap(link).ok().unwrap()
        };
        let charged = short.settle_calls("ses_a").await.unwrap();
        assert_eq!(charged.len(), 1, "{charged:?}");
        assert_eq!(
            (charged[0].id.as_str(), charged[0].charged),
            ("call_2", est)
        );
        assert_eq!(s.get("session:ses_a").await.unwrap().used_tokens, 140);
        assert_eq!(s.get("tenant:ten_a").await.unwrap().used_tokens, 100);
        assert_eq!(s.open_reservations("session:ses_a").await.unwrap(), 0);
        assert!(!s.settle("call_2", &both, est).await.unwrap());
        assert_eq!(s.get("session:ses_a").await.unwrap().used_tokens, 140);
    }
}
