//! A [`Directory`] fake for other crates' tests: it knows a fixed list of
//! hosts and no sandbox, snapshot, session or tenant (what posting to a
//! session's owner needs; routing's own tests use the real store).

use crate::{Directory, HostSlot, Location, RouteError};
use std::collections::BTreeMap;

/// Hosts `0`, nothing else.
pub struct FixedHosts(pub Vec<HostSlot>);

/// Host `id` at `url`, alive or lost, with room for one sandbox.
pub fn slot(id: &str, url: String, alive: bool) -> HostSlot {
    HostSlot {
        id: id.into(),
        url,
        capacity: 1,
        live: 0,
        alive,
        routed: alive,
        placeable: alive,
        warm: vec![],
    }
}

#[async_trait::async_trait]
impl Directory for FixedHosts {
    async fn sandbox(&self, _: &str) -> Result<Location, RouteError> {
        Ok(Location::Unknown)
    }
    async fn snapshot(&self, _: &str) -> Result<Location, RouteError> {
        Ok(Location::Unknown)
    }
    async fn session(&self, _: &str) -> Result<Location, RouteError> {
        Ok(Location::Unknown)
    }
    async fn hosts(&self) -> Result<Vec<HostSlot>, RouteError> {
        Ok(self.0.clone())
    }
    async fn tenant_live(&self, _: &str) -> Result<BTreeMap<String, u32>, RouteError> {
        Ok(BTreeMap::new())
    }
    async fn tenant_of(&self, _: &crate::Scope) -> Result<Option<String>, RouteError> {
        Ok(None)
    }
}
