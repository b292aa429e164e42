//! What the sweeper asks of this host's sessions: take a lost host's
//! unfinished sessions over (hatchery-sessions `take_over_from`).

use hatchery_sessions::error::SessionError;
use hatchery_sessions::Sessions;
use std::sync::Arc;

/// Contract: moves every unfinished session of `lost_host` to this host
/// (a new epoch fences the lost host's writes) and starts their runners
/// here; returns how many moved. Idempotent: a second call for the same
/// host moves nothing. An error leaves the rest for the next sweep.
#[async_trait::async_trait]
pub trait SessionTakeover: Send + Sync {
    async fn take_over_from(&self, lost_host: &str) -> Result<usize, SessionError>;
}

// On the `Arc`: the runners it starts hold the service.
#[async_trait::async_trait]
impl SessionTakeover for Arc<Sessions> {
    async fn take_over_from(&self, lost_host: &str) -> Result<usize, SessionError> {
        Sessions::take_over_from(self, lost_host).await
    }
}

/// Records the hosts it was asked to take over from, for tests.
#[cfg(test)]
pub(crate) mod fake {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    pub struct FakeTakeover {
        pub asked: Mutex<Vec<String>>,
        pub fail: bool,
    }

    #[async_trait::async_trait]
    impl SessionTakeover for FakeTakeover {
        async fn take_over_from(&self, lost_host: &str) -> Result<usize, SessionError> {
            self.asked.lock().unwrap().push(lost_host.into());
            if self.fail {
                return Err(SessionError::StoreUnavailable("fake".into()));
            }
            Ok(1)
        }
    }
}
