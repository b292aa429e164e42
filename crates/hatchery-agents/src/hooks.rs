//! What a host plugs into sessions: the in-process gateway and egress
//! proxy behind `SessionHooks`. (Policies come from the policy store through
//! `hatchery_broker::catalog::StorePolicies`.)

use hatchery_gateway::embed::{GatewayLink, TenantScope};
use hatchery_sessions::egress::{Binding, EgressLink};
use hatchery_sessions::hooks::{HookError, SessionHooks};
use hatchery_sessions::store::Session;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Why a host could not bind a sandbox to its session, or give it its
/// credentials' placeholders.
#[derive(Debug, thiserror::Error)]
pub enum HostHookError {
    #[error("the limits of tenant {tenant}")]
    TenantLimits {
        tenant: String,
        #[source]
        source: hatchery_tenants::StoreError,
    },
    #[error("model gateway")]
    Gateway(#[source] hatchery_gateway::budget::BudgetError),
    #[error("pinned policy")]
    Policy(#[source] hatchery_policy::StoreError),
}

pub struct HostHooks {
    pub gateway: Option<Arc<GatewayLink>>,
    pub egress: Option<Arc<EgressLink>>,
    /// A tenant's session's calls are charged within its tenant's limits
    /// too (read at each bind).
    pub tenants: Arc<hatchery_tenants::Tenants>,
    /// The sessions' pinned policies, for what they say of a diverged
    /// re-run.
    pub policies: Arc<hatchery_policy::cache::CompiledPolicies>,
}

impl HostHooks {
    /// The gateway scope of the session's tenant, with its limits now.
    async fn tenant_scope(&self, s: &Session) -> Result<Option<TenantScope>, HostHookError> {
        let Some(t) = &s.spec.tenant else {
            return Ok(None);
        };
        let l = self
            .tenants
            .limits(t)
            .await
            .map_err(|source| HostHookError::TenantLimits {
                tenant: t.clone(),
                source,
            })?;
        Ok(Some(TenantScope {
            id: t.clone(),
            tokens: l.tokens,
            usd_cents: l.usd_cents,
        }))
    }
}

#[async_trait::async_trait]
impl SessionHooks for HostHooks {
    async fn bind(&self, s: &Session, sandbox: &str) -> Result<(), HookError> {
        if let Some(e) = &self.egress {
            e.bind(
                sandbox,
                Binding {
                    session: s.id.clone(),
                    policy_id: s.spec.policy_id.clone(),
                    policy_version: s.spec.policy_version,
                    tenant: s.spec.tenant.clone(),
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
            .map_err(HostHookError::Gateway)?;
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
            Ok(charged) if charged.is_empty() => {}
            Ok(charged) => {
                let tokens: u64 = charged.iter().map(|e| e.charged.tokens).sum();
                tracing::warn!(session, calls = charged.len(), tokens, "calls still in flight at the session's end were charged their whole reservations")
            }
            Err(e) => {
                tracing::warn!(session, error = %hatchery_serve::error_text::with_causes(&e), "could not wait for the session's calls in flight")
            }
        }
    }

    fn agent_env(&self, _s: &Session) -> BTreeMap<String, String> {
        match &self.egress {
            Some(e) => proxy_env(e.guest_port),
            None => BTreeMap::new(),
        }
    }

    fn meters_spend(&self) -> bool {
        self.gateway.is_some()
    }

    fn guest_ca(&self) -> Option<String> {
        self.egress.as_ref().and_then(|e| e.ca_pem.clone())
    }

    async fn replay_diverged(
        &self,
        s: &Session,
        n: u64,
        kind: &str,
        asked: &str,
    ) -> Result<hatchery_sessions::replay::Verdict, HookError> {
        let p = self
            .policies
            .get(&s.spec.policy_id, s.spec.policy_version)
            .await
            .map_err(HostHookError::Policy)?;
        Ok(hatchery_sessions::replay::verdict(&p, n, kind, asked))
    }

    async fn placeholder_env(&self, s: &Session) -> Result<BTreeMap<String, String>, HookError> {
        let Some(e) = &self.egress else {
            return Ok(BTreeMap::new());
        };
        let vars = e
            .placeholders(&s.spec.policy_id, s.spec.policy_version)
            .await
            .map_err(HostHookError::Policy)?;
        Ok(vars.into_iter().collect())
    }
}

/// What points the agent's tools at the egress proxy on guest loopback
/// port `guest_port`.
pub(crate) fn proxy_env(guest_port: u16) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    let url = format!("http://127.0.0.1:{guest_port}");
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
    env
}

/// The secrets store on the deployment's database, sealed with the key
/// file (`--secrets-key-file`, DATA_DIR/secrets.key by default).
pub async fn open_secrets(
    args: &hatchery_config::DaemonArgs,
    db: &hatchery_db::Db,
    data: &std::path::Path,
) -> Result<hatchery_secrets::Secrets, crate::AgentsError> {
    let path = args
        .egress
        .secrets_key_file
        .clone()
        .unwrap_or_else(|| data.join("secrets.key"));
    let key = hatchery_secrets::SecretKey::load_or_create(&path)?;
    Ok(hatchery_secrets::Secrets::open(db.clone(), key).await?)
}

/// The egress proxy's credential injection: the CA (`--egress-ca-dir`,
/// DATA_DIR/egress-ca by default), the upstream trust (`--egress-upstream-ca-file`)
/// and the secrets store. None when the proxy is off.
pub fn interception(
    args: &hatchery_config::DaemonArgs,
    data: &std::path::Path,
    secrets: hatchery_secrets::Secrets,
) -> Result<Option<Arc<hatchery_egress::Interception>>, crate::AgentsError> {
    if args.egress.guest_port == 0 {
        return Ok(None);
    }
    use hatchery_egress::intercept::ca;
    let dir = args
        .egress
        .ca_dir
        .clone()
        .unwrap_or_else(|| data.join("egress-ca"));
    Ok(Some(Arc::new(hatchery_egress::Interception {
        ca: Arc::new(ca::Ca::load_or_create(&dir)?),
        upstream: ca::upstream_config(
            args.egress
                .upstream_ca_file
                .as_deref()
                .unwrap_or(std::path::Path::new(hatchery_tls::SYSTEM_BUNDLE)),
        )?,
        secrets: Arc::new(SecretValues(secrets)),
    })))
}

/// The proxy reads a value only when a request gets it.
struct SecretValues(hatchery_secrets::Secrets);

#[async_trait::async_trait]
impl hatchery_egress::CredentialSource for SecretValues {
    async fn reveal(
        &self,
        tenant: Option<&str>,
        secret: &str,
    ) -> Result<hatchery_egress::Zeroizing<Vec<u8>>, hatchery_egress::SourceError> {
        Ok(self.0.reveal(tenant, secret).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tool_is_pointed_at_the_proxy_and_host_services_bypass_it() {
        let env = proxy_env(3128);
        for k in [
            "HTTPS_PROXY",
            "https_proxy",
            "HTTP_PROXY",
            "http_proxy",
            "PIP_PROXY",
        ] {
            assert_eq!(env[k], "http://127.0.0.1:3128", "{k}");
        }
        // git's one config entry, counted, so git reads exactly it.
        assert_eq!(env["GIT_CONFIG_COUNT"], "1");
        assert_eq!(env["GIT_CONFIG_KEY_0"], "http.proxy");
        assert_eq!(env["GIT_CONFIG_VALUE_0"], "http://127.0.0.1:3128");
        // The gateway and broker are on guest loopback: never proxied.
        assert_eq!(env["NO_PROXY"], "127.0.0.1,localhost");
        assert_eq!(env["no_proxy"], env["NO_PROXY"]);
    }
}
