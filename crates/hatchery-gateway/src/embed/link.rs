//! The running embedded gateway, as the daemon's session hooks use it:
//! a sandbox's calls charged to its session, within the session's budget.

use crate::budget::{BudgetError, BudgetStore, Caller, KeyStore};
use std::path::PathBuf;
use std::sync::Arc;

pub struct GatewayLink {
    pub store: Arc<dyn BudgetStore>,
    pub keys: Arc<dyn KeyStore>,
    /// Where sandboxes reach it on their loopback.
    pub guest_port: u16,
    /// The Unix socket the daemon registers as that host service.
    pub socket: PathBuf,
}

impl GatewayLink {
    /// Charges `sandbox`'s calls to `session`, within its budget
    /// (`usd_cents` 0: no limit in cents).
    pub async fn bind(
        &self,
        session: &str,
        sandbox: &str,
        tokens: u64,
        usd_cents: u64,
    ) -> Result<(), BudgetError> {
        let scope = format!("session:{session}");
        self.store
            .set_limits(&scope, Some(tokens), (usd_cents > 0).then_some(usd_cents))
            .await?;
        self.keys
            .bind_sandbox(
                sandbox,
                &Caller {
                    session: session.to_string(),
                    tenant: None,
                },
            )
            .await
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
        };
        link.bind("ses_a", "sbx_1", 1000, 0).await.unwrap();
        let who = s.caller_of_sandbox("sbx_1").await.unwrap().unwrap();
        assert_eq!(who.session, "ses_a");
        let b = s.get("session:ses_a").await.unwrap();
        assert_eq!((b.limit_tokens, b.limit_usd_cents), (Some(1000), None));
        link.bind("ses_a", "sbx_1", 1000, 25).await.unwrap();
        let b = s.get("session:ses_a").await.unwrap();
        assert_eq!(b.limit_usd_cents, Some(25));
        link.unbind("sbx_1").await;
        assert!(s.caller_of_sandbox("sbx_1").await.unwrap().is_none());
        // Twice: nothing to unbind, nothing fails.
        link.unbind("sbx_1").await;
    }
}
