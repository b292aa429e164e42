//! Where a shedding host's sessions go (hatchery-sessions
//! `HandoffTargets`): a placeable host other than this one (ready, alive,
//! not held by the operator, not stopping), the one with the most free
//! room first, as placement would choose for a new session.

use hatchery_route::{control::by_preference, Directory};
use hatchery_sessions::handoff::HandoffTargets;
use std::sync::Arc;

pub struct DirectoryTargets {
    pub directory: Arc<dyn Directory>,
    /// This host's id: never its own target.
    pub me: String,
}

#[async_trait::async_trait]
impl HandoffTargets for DirectoryTargets {
    async fn pick(&self) -> Option<String> {
        let hosts = match self.directory.hosts().await {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(error = %e, "no hand-over target: the host list did not answer");
                return None;
            }
        };
        by_preference(hosts)
            .into_iter()
            .find(|h| h.placeable && h.id != self.me)
            .map(|h| h.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hatchery_route::{HostSlot, Location, RouteError};
    use std::collections::BTreeMap;

    struct Hosts(Vec<HostSlot>);

    #[async_trait::async_trait]
    impl Directory for Hosts {
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
        async fn tenant_of(&self, _: &hatchery_route::Scope) -> Result<Option<String>, RouteError> {
            Ok(None)
        }
    }

    fn slot(id: &str, live: u32, placeable: bool) -> HostSlot {
        HostSlot {
            id: id.into(),
            url: format!("http://{id}"),
            capacity: 10,
            live,
            alive: true,
            routed: true,
            placeable,
            warm: vec![],
        }
    }

    #[tokio::test]
    async fn the_most_free_placeable_other_host_takes_it() {
        let t = |hosts: Vec<HostSlot>| DirectoryTargets {
            directory: Arc::new(Hosts(hosts)),
            me: "a".into(),
        };
        // Never itself, however free; never a held or stopping host.
        let all = vec![
            slot("a", 0, true),
            slot("b", 5, true),
            slot("c", 2, true),
            slot("d", 0, false),
        ];
        assert_eq!(t(all).pick().await.as_deref(), Some("c"));
        let none = vec![slot("a", 0, true), slot("d", 0, false)];
        assert_eq!(t(none).pick().await, None);
    }
}
