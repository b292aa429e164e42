//! Tenant keys for the routing layers (hatchery-route's [`TenantKeys`]),
//! answered from the tenant store itself: a key revoked on any host stops
//! being forwarded at once, with no cache to wait out.

use hatchery_route::{RouteError, TenantKeys};
use hatchery_tenants::{keys, LiveUsage, StoreError, TenantStore, Usage, UsageError};
use std::sync::Arc;

pub struct StoreTenantKeys(pub Arc<dyn TenantStore>);

#[async_trait::async_trait]
impl TenantKeys for StoreTenantKeys {
    async fn tenant(&self, bearer: &str) -> Result<Option<String>, RouteError> {
        if !keys::well_formed(bearer) {
            return Ok(None);
        }
        match self.0.owner(&keys::hash(bearer)).await {
            Ok(owner) => Ok(owner.map(|o| o.tenant)),
            Err(e @ StoreError::Unavailable(_)) => Err(RouteError::Store(
                hatchery_serve::error_text::with_causes(&e),
            )),
            Err(e) => {
                tracing::error!(error = %hatchery_serve::error_text::with_causes(&e), "resolving a tenant key to route it");
                Err(RouteError::Store(e.to_string()))
            }
        }
    }
}

/// The control role's [`LiveUsage`]: it resolves tenant keys (for the
/// rounds it serves) but admits no sandbox itself, its hosts do; asked to
/// count, it says it cannot rather than answer zero.
pub struct NothingCounted;

#[derive(Debug, thiserror::Error)]
#[error("the control role counts no sandboxes; its hosts admit them")]
struct NotCountedHere;

#[async_trait::async_trait]
impl LiveUsage for NothingCounted {
    async fn usage(&self, tenant: &str) -> Result<Usage, UsageError> {
        Err(UsageError {
            tenant: tenant.to_string(),
            source: Box::new(NotCountedHere),
        })
    }
}
