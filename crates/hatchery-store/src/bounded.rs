//! Every store call on a shared database, bounded in time. A database that
//! keeps the TCP connection open but stops answering (a stopped server
//! process, a network that drops packets) would otherwise hold a request,
//! a routing lookup or the lease keeper's renewal for as long as the
//! kernel keeps the connection: here each call ends within
//! [`CALL_LIMIT`] with [`StoreError::Unavailable`], which the API answers
//! 503 with Retry-After. A call cut off this way may still have committed
//! (as with any client that loses its answer); it was never acknowledged.

use crate::{Result, Store, StoreError};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// The most one store call may take, pool wait and connect included.
/// Above the pool's own 10 s would make those pointless; 5 s leaves the
/// lease keeper (renewal every 10 s, give-up 10 s before expiry) room for
/// one failed attempt and a retry before it must give up.
pub const CALL_LIMIT: Duration = Duration::from_secs(5);

pub struct Bounded {
    pub(crate) inner: Arc<dyn Store>,
    limit: Duration,
}

impl Bounded {
    pub fn new(inner: Arc<dyn Store>, limit: Duration) -> Self {
        Bounded { inner, limit }
    }

    pub(crate) async fn run<T>(&self, op: &str, fut: impl Future<Output = Result<T>>) -> Result<T> {
        match tokio::time::timeout(self.limit, fut).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Unavailable(format!(
                "{op}: no answer from the database within {} ms",
                self.limit.as_millis()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DbStore, SandboxRow};

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
