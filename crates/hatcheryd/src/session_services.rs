//! What the daemon plugs into sessions: the in-process gateway and egress
//! proxy behind `SessionHooks`. (Policies come from the policy store through
//! `hatchery_broker::catalog::StorePolicies`.)

use hatchery_gateway::embed::{GatewayLink, TenantScope};
use hatchery_sessions::egress::{Binding, EgressLink};
use hatchery_sessions::hooks::SessionHooks;
use hatchery_sessions::store::Session;
use std::collections::BTreeMap;
use std::sync::Arc;

pub struct DaemonHooks {
    pub gateway: Option<Arc<GatewayLink>>,
    pub egress: Option<Arc<EgressLink>>,
    /// A tenant's session's calls are charged within its tenant's limits
    /// too (read at each bind).
    pub tenants: Arc<hatchery_tenants::Tenants>,
}

impl DaemonHooks {
    /// The gateway scope of the session's tenant, with its limits now.
    async fn tenant_scope(&self, s: &Session) -> Result<Option<TenantScope>, String> {
        let Some(t) = &s.spec.tenant else {
            return Ok(None);
        };
        let l = self.tenants.limits(t).await.map_err(|e| {
            format!(
                "the limits of tenant {t}: {}",
                hatchery_serve::error_text::with_causes(&e)
            )
        })?;
        Ok(Some(TenantScope {
            id: t.clone(),
            tokens: l.tokens,
            usd_cents: l.usd_cents,
        }))
    }
}

#[async_trait::async_trait]
impl SessionHooks for DaemonHooks {
    async fn bind(&self, s: &Session, sandbox: &str) -> Result<(), String> {
        if let Some(e) = &self.egress {
            e.bind(
                sandbox,
                Binding {
                    session: s.id.clone(),
                    policy_id: s.spec.policy_id.clone(),
                    policy_version: s.spec.policy_version,
                },
            );
        }
        if let Some(g) = &self.gateway {
            let tenant = self.tenant_scope(s).await?;
            g.bind(
                &s.id,
                sandbox,
                (s.spec.budget_tokens, s.spec.budget_usd_cents),
                tenant.as_ref(),
            )
            .await
            .map_err(|e| format!("model gateway: {e}"))?;
        }
        Ok(())
    }

    async fn unbind(&self, _session: &str, sandbox: &str) {
        if let Some(e) = &self.egress {
            e.unbind(sandbox).await;
        }
        if let Some(g) = &self.gateway {
            g.unbind(sandbox).await;
        }
    }

    async fn settle_calls(&self, session: &str) {
        let Some(g) = &self.gateway else { return };
        match g.settle_calls(session).await {
            Ok(0) => {}
            Ok(open) => {
                tracing::warn!(session, open, "calls still in flight when the session's spend was reported (their reservations expire)")
            }
            Err(e) => {
                tracing::warn!(session, error = %hatchery_serve::error_text::with_causes(&e), "could not wait for the session's calls in flight")
            }
        }
    }

    fn agent_env(&self, _s: &Session) -> BTreeMap<String, String> {
        let mut env = BTreeMap::new();
        if let Some(e) = &self.egress {
            let url = format!("http://127.0.0.1:{}", e.guest_port);
            for k in ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"] {
                env.insert(k.to_string(), url.clone());
            }
            // pip reads PIP_PROXY as its --proxy; git reads http.proxy from
            // GIT_CONFIG_* (git >= 2.31), so neither needs a config file.
            env.insert("PIP_PROXY".into(), url.clone());
            env.insert("GIT_CONFIG_COUNT".into(), "1".into());
            env.insert("GIT_CONFIG_KEY_0".into(), "http.proxy".into());
            env.insert("GIT_CONFIG_VALUE_0".into(), url);
            // Host services (the gateway among them) are on guest loopback.
            for k in ["NO_PROXY", "no_proxy"] {
                env.insert(k.to_string(), "127.0.0.1,localhost".into());
            }
        }
        env
    }

    fn meters_spend(&self) -> bool {
        self.gateway.is_some()
    }
}
