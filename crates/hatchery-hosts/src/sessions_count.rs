//! How many unfinished sessions each host owns, for `GET /v1/hosts`.

use async_trait::async_trait;
use hatchery_sessions::state::SessionState;
use hatchery_sessions::store::{ListFilter, SessionStore, StoreError};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Most sessions counted per state: the count is a view for operators,
/// not an accounting, and one request never reads more rows than this
/// (a host at the cap shows the cap).
pub const MAX_COUNTED: usize = 10_000;

/// Contract: unfinished sessions per owning host; hosts with none absent.
#[async_trait]
pub trait SessionCounts: Send + Sync {
    async fn per_host(&self) -> Result<BTreeMap<String, u32>, StoreError>;
}

#[async_trait]
impl SessionCounts for Arc<dyn SessionStore> {
    async fn per_host(&self) -> Result<BTreeMap<String, u32>, StoreError> {
        let mut n = BTreeMap::new();
        for state in SessionState::ALL.into_iter().filter(|s| !s.is_terminal()) {
            let f = ListFilter {
                state: Some(state),
                limit: MAX_COUNTED,
                ..ListFilter::default()
            };
            for s in self.list(&f).await? {
                *n.entry(s.host_id).or_insert(0) += 1;
            }
        }
        Ok(n)
    }
}

/// Fixed counts, for tests.
#[cfg(test)]
pub(crate) mod fake {
    pub struct FixedCounts(pub std::collections::BTreeMap<String, u32>);

    #[async_trait::async_trait]
    impl super::SessionCounts for FixedCounts {
        async fn per_host(
            &self,
        ) -> Result<std::collections::BTreeMap<String, u32>, super::StoreError> {
            Ok(self.0.clone())
        }
    }
}
