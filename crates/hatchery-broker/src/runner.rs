//! Which broker process is running a call. A call taken into `executing`
//! records its process's runner id; each process renews a heartbeat row in
//! the store (on the shared database, by its clock). Another broker (a
//! second control process, or the host a session moved to) resolves a call
//! left `executing` only once its runner's heartbeat has lapsed; before
//! that it waits, since the effect may still be under way there.

use crate::store::{BrokerStore, StoreError};
use rand::Rng;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a heartbeat keeps a runner alive.
pub const TTL: Duration = Duration::from_secs(15);
/// How often a runner renews it: three tries before it lapses.
pub const BEAT: Duration = Duration::from_secs(5);
/// How long a request for a call another live process is running waits
/// for it to finish before answering 503 (the agent asks again).
pub const WAIT_FOR_OTHER: Duration = Duration::from_secs(20);

pub struct Runner {
    pub id: String,
    last_beat: Mutex<Option<Instant>>,
}

impl Default for Runner {
    fn default() -> Self {
        Self::new()
    }
}

impl Runner {
    pub fn new() -> Runner {
        let n: u128 = rand::thread_rng().gen();
        Runner {
            id: format!("brn_{:024x}", n >> 32),
            last_beat: Mutex::new(None),
        }
    }

    pub async fn beat(&self, store: &BrokerStore) -> Result<(), StoreError> {
        let at = Instant::now();
        store.heartbeat(&self.id, TTL.as_secs() as u32).await?;
        *self.last_beat.lock().unwrap_or_else(|p| p.into_inner()) = Some(at);
        Ok(())
    }

    /// Before an effect starts: a heartbeat no older than [`BEAT`], so
    /// the effect has most of a [`TTL`] before anyone may think this
    /// process gone. A store that cannot take it means no effect now.
    pub async fn ensure_fresh(&self, store: &BrokerStore) -> Result<(), StoreError> {
        let fresh = self
            .last_beat
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|t| t.elapsed() < BEAT);
        if fresh {
            return Ok(());
        }
        self.beat(store).await
    }

    /// Whether a call with this runner may be resolved here as stopped
    /// mid-effect: it is not ours (ours is either in flight under its
    /// key's lock or was cut off by an error this process reported) and
    /// its process has stopped renewing.
    pub async fn others_gone(
        &self,
        store: &BrokerStore,
        runner: Option<&str>,
    ) -> Result<bool, StoreError> {
        match runner {
            // Calls from before runners were recorded.
            None => Ok(true),
            Some(r) if r == self.id => Ok(true),
            Some(r) => Ok(!store.runner_alive(r).await?),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_runner_is_fresh_after_a_beat_and_knows_its_own_calls() {
        let s = BrokerStore::open_in_memory().await.unwrap();
        let r = Runner::new();
        assert!(r.id.starts_with("brn_") && r.id.len() == 28, "{}", r.id);
        assert_ne!(r.id, Runner::new().id);
        assert!(r.last_beat.lock().unwrap().is_none());
        r.ensure_fresh(&s).await.unwrap();
        assert!(r.last_beat.lock().unwrap().is_some());
        assert!(r.others_gone(&s, None).await.unwrap());
        assert!(r.others_gone(&s, Some(&r.id)).await.unwrap());
        // On SQLite only one process uses the file: another id is a
        // previous process.
        assert!(r.others_gone(&s, Some("brn_other")).await.unwrap());
    }
}
