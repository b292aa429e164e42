//! The sessions' policy catalog over the policy store: a session created
//! with `policy_id` pins that policy's latest version at that moment.

use hatchery_policy::PolicyStore;
use hatchery_sessions::policy::{PolicyCatalog, PolicyRef};
use std::sync::Arc;

pub struct StorePolicies(pub Arc<dyn PolicyStore>);

#[async_trait::async_trait]
impl PolicyCatalog for StorePolicies {
    async fn resolve(&self, id: &str) -> Option<PolicyRef> {
        match self.0.latest(id).await {
            Ok(p) => Some(PolicyRef {
                id: p.id,
                version: p.version,
                tenant: p.tenant,
                builtin: p.builtin,
            }),
            Err(e) => {
                if !matches!(e, hatchery_policy::StoreError::NotFound(_)) {
                    tracing::warn!(policy = %id, error = %e, "policy lookup failed");
                }
                None
            }
        }
    }
}
