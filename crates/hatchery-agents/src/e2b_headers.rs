//! E2B's header transforms (`network.rules`) over this host's egress
//! proxy and the deployment's secrets store: what
//! `hatchery_e2b_backend::headers::EgressHeaders` needs (docs/e2b.md,
//! "Header transforms"). Values go into the secrets store sealed, under
//! the sandbox's names; the proxy reads them only when it adds one to a
//! request; the sandbox gets the proxy's variables and its CA, as a
//! session's sandbox does.

use hatchery_e2b_backend::headers::{EgressHeaders, HeaderError, SECRET_PREFIX};
use hatchery_secrets::{Secrets, StoreError};
use hatchery_sessions::egress::EgressLink;
use hatchery_sessions::guest_trust;
use std::collections::BTreeMap;
use std::sync::Arc;

pub struct E2bHeaders {
    secrets: Secrets,
    egress: Arc<EgressLink>,
    ca_pem: String,
}

impl E2bHeaders {
    /// `None` when the proxy does not intercept (it has no CA): then
    /// `network.rules` are refused.
    pub fn new(secrets: Secrets, egress: Arc<EgressLink>) -> Option<Self> {
        let ca_pem = egress.ca_pem.clone()?;
        Some(E2bHeaders {
            secrets,
            egress,
            ca_pem,
        })
    }
}

#[async_trait::async_trait]
impl EgressHeaders for E2bHeaders {
    fn guest_env(&self, own: &BTreeMap<String, String>) -> BTreeMap<String, String> {
        let mut env = own.clone();
        for (k, v) in crate::hooks::proxy_env(self.egress.guest_port) {
            env.entry(k).or_insert(v);
        }
        // None of the trust variables when the caller names any itself.
        guest_trust::add_trust_env(&mut env);
        env
    }

    fn ca_pem(&self) -> String {
        self.ca_pem.clone()
    }

    fn ca_install_script(&self, staged: &str) -> String {
        guest_trust::install_script(staged)
    }

    async fn seal(&self, name: &str, value: &str) -> Result<(), HeaderError> {
        match self.secrets.create(None, name, value).await {
            Ok(_) => Ok(()),
            Err(StoreError::TooMany(n)) => Err(HeaderError::Full(n)),
            Err(e) => Err(HeaderError::Store(Box::new(e))),
        }
    }

    async fn forget(&self, name: &str) {
        match self.secrets.delete(None, name).await {
            Ok(()) | Err(StoreError::NotFound(_)) => {}
            Err(e) => {
                tracing::warn!(secret = name, error = %hatchery_serve::error_text::with_causes(&e),
                    "e2b: a header value was not deleted; the sweep tries again")
            }
        }
    }

    async fn sealed(&self) -> Result<Vec<String>, HeaderError> {
        let all = self
            .secrets
            .list(hatchery_secrets::Listing::Of(None))
            .await
            .map_err(|e| HeaderError::Store(Box::new(e)))?;
        Ok(all
            .into_iter()
            .map(|s| s.name)
            .filter(|n| n.starts_with(SECRET_PREFIX))
            .collect())
    }

    fn bind(&self, sandbox: &str, policy: Arc<hatchery_policy::Policy>) {
        self.egress.bind_sandbox(sandbox, policy);
    }

    fn unbind(&self, sandbox: &str) {
        self.egress.unbind_sandbox(sandbox);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_e2b_names_are_the_ones_the_secrets_api_reserves() {
        assert_eq!(
            hatchery_e2b_backend::headers::SECRET_PREFIX,
            hatchery_secrets::http::RESERVED_PREFIX
        );
    }
}
