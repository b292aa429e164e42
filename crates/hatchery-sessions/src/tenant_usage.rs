//! A tenant's unfinished sessions as hatchery-tenants counts them
//! ([`hatchery_tenants::LiveUsage`]): a tenant is not deleted while one
//! is unfinished, on any host (the store is the deployment's).

use crate::store::SessionStore;
use hatchery_tenants::{LiveUsage, Usage, UsageError};
use std::sync::Arc;

pub struct SessionUsage(pub Arc<dyn SessionStore>);

#[async_trait::async_trait]
impl LiveUsage for SessionUsage {
    async fn usage(&self, tenant: &str) -> Result<Usage, UsageError> {
        let live_sessions = self
            .0
            .unfinished_of_tenant(tenant)
            .await
            .map_err(|e| UsageError {
                tenant: tenant.into(),
                source: Box::new(e),
            })?;
        Ok(Usage {
            live_sandboxes: 0,
            live_sessions,
        })
    }
}
