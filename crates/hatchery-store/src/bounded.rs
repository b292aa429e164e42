//! Every store call on a shared database, bounded in time. A database that
//! keeps the TCP connection open but stops answering (a stopped server
//! process, a network that drops packets) would otherwise hold a request,
//! a routing lookup or the lease keeper's renewal for as long as the
//! kernel keeps the connection: here each call ends within
//! [`CALL_LIMIT`] with [`StoreError::Unavailable`], which the API answers
//! 503 with Retry-After. A call cut off this way may still have committed
//! (as with any client that loses its answer); it was never acknowledged.

use crate::rows::{
    Event, Fence, HostRow, Lease, NetRow, SandboxFilter, SandboxRow, SandboxState, SnapshotRow,
};
use crate::{Result, Store, StoreError};
use async_trait::async_trait;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// The most one store call may take, pool wait and connect included.
/// Above the pool's own 10 s would make those pointless; 5 s leaves the
/// lease keeper (renewal every 10 s, give-up 10 s before expiry) room for
/// one failed attempt and a retry before it must give up.
pub const CALL_LIMIT: Duration = Duration::from_secs(5);

pub struct Bounded {
    inner: Arc<dyn Store>,
    limit: Duration,
}

impl Bounded {
    pub fn new(inner: Arc<dyn Store>, limit: Duration) -> Self {
        Bounded { inner, limit }
    }

    async fn run<T>(&self, op: &'static str, fut: impl Future<Output = Result<T>>) -> Result<T> {
        match tokio::time::timeout(self.limit, fut).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Unavailable(format!(
                "{op}: no answer from the database within {} ms",
                self.limit.as_millis()
            ))),
        }
    }
}

/// Forwards each listed method to the inner store under the limit. The
/// list is the whole trait: a method added to [`Store`] and not here is a
/// compile error, so nothing escapes the bound.
macro_rules! bounded {
    ($( fn $name:ident(&self $(, $arg:ident : $ty:ty)*) -> $ret:ty; )*) => {
        #[async_trait]
        impl Store for Bounded {
            fn backend(&self) -> &'static str {
                self.inner.backend()
            }
            $(
                async fn $name(&self $(, $arg: $ty)*) -> Result<$ret> {
                    self.run(stringify!($name), self.inner.$name($($arg),*)).await
                }
            )*
        }
    };
}

bounded! {
    fn insert_sandbox(&self, f: &Fence, r: &SandboxRow) -> ();
    fn transition(&self, f: &Fence, id: &str, from: &[SandboxState], to: SandboxState) -> bool;
    fn stop(&self, f: &Fence, id: &str, reason: &str, now_ms: u64) -> bool;
    fn claim(&self, f: &Fence, r: &SandboxRow) -> bool;
    fn set_expiry(&self, f: &Fence, id: &str, expires_at_ms: u64) -> bool;
    fn get_live(&self, id: &str) -> Option<SandboxRow>;
    fn list_live(&self, filter: &SandboxFilter) -> Vec<SandboxRow>;
    fn list_unstopped(&self, host: &str) -> Vec<SandboxRow>;
    fn expired(&self, host: &str, now_ms: u64) -> Vec<String>;
    fn append_event(&self, f: &Fence, id: &str, kind: &str, detail: &str) -> u64;
    fn events(&self, id: &str) -> Vec<Event>;
    fn insert_snapshot(&self, f: &Fence, s: &SnapshotRow) -> ();
    fn get_snapshot(&self, id: &str) -> Option<SnapshotRow>;
    fn list_snapshots(&self, filter: &BTreeMap<String, String>) -> Vec<SnapshotRow>;
    fn count_snapshots_of(&self, template: &str) -> u64;
    fn delete_snapshot(&self, f: &Fence, id: &str) -> bool;
    fn expired_snapshots(&self, host: &str, now_ms: u64) -> Vec<String>;
    fn expired_shared_snapshots(&self, now_ms: u64) -> Vec<String>;
    fn set_net(&self, f: &Fence, id: &str, slot: u32, policy: &str, event: bool) -> ();
    fn clear_net(&self, f: &Fence, id: &str) -> ();
    fn all_net(&self, host: &str) -> Vec<NetRow>;
    fn take_lease(&self, resource: &str, owner: &str, ttl_ms: u64) -> Lease;
    fn renew_lease(&self, f: &Fence, ttl_ms: u64) -> Lease;
    fn release_lease(&self, f: &Fence) -> bool;
    fn get_lease(&self, resource: &str) -> Option<Lease>;
    fn register_host(&self, f: &Fence, address: &str, capacity: u32) -> ();
    fn heartbeat(&self, f: &Fence, live: u32, warm_templates: &[String]) -> bool;
    fn list_hosts(&self) -> Vec<HostRow>;
    fn live_per_host(&self, filter: &SandboxFilter) -> BTreeMap<String, u32>;
    fn deployment_secret(&self, name: &str, candidate: &str) -> String;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DbStore;

    #[tokio::test]
    async fn a_call_that_never_answers_is_unavailable_within_the_limit() {
        let inner: Arc<dyn Store> = Arc::new(DbStore::scratch().await.unwrap());
        let b = Bounded::new(inner.clone(), Duration::from_millis(50));
        // A normal call passes through.
        assert_eq!(b.backend(), "sqlite");
        assert!(b.get_live("sbx-none").await.unwrap().is_none());
        let t = std::time::Instant::now();
        // What a stopped database server does: never answer.
        let never = std::future::pending::<Result<Option<SandboxRow>>>();
        let e = b.run("get_live", never).await.unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(2));
        assert!(e.is_unavailable(), "{e}");
        assert!(e.to_string().contains("get_live"), "{e}");
    }
}
