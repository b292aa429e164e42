//! E2B's resume claims: before one daemon resumes a paused sandbox it
//! claims it, so that two requests (on this daemon or any other sharing
//! the state store) do not both restore it. A claim is a lease in the
//! store named `e2b-resume:{e2b id}`, lapsing after
//! `RESUME_CLAIM_TTL_S` if its holder dies without releasing it.
//!
//! The store is reached through the narrow [`Leases`] trait: the daemon
//! passes its store ([`StoreLeases`]), tests a fake.

use crate::error::E2bBackendError;
use async_trait::async_trait;
use hatchery_core::store::{Fence, Lease, Store, StoreError};
use hatchery_e2b::backend::{ResumeClaim, RESUME_CLAIM_TTL_S};
use std::sync::Arc;

/// What claims need of the state store. Contract (the store's): `take`
/// answers `StoreError::LeaseHeld` while another owner's unexpired lease
/// holds the resource, and otherwise takes it at a higher epoch (also
/// from the same owner); `release` of a lease taken over since is not an
/// error (`Ok(false)`).
#[async_trait]
pub trait Leases: Send + Sync {
    async fn take(&self, resource: &str, owner: &str, ttl_ms: u64) -> Result<Lease, StoreError>;
    async fn release(&self, fence: &Fence) -> Result<bool, StoreError>;
}

/// [`Leases`] in the state store every daemon of the deployment shares.
pub struct StoreLeases(pub Arc<dyn Store>);

#[async_trait]
impl Leases for StoreLeases {
    async fn take(&self, resource: &str, owner: &str, ttl_ms: u64) -> Result<Lease, StoreError> {
        self.0.take_lease(resource, owner, ttl_ms).await
    }
    async fn release(&self, fence: &Fence) -> Result<bool, StoreError> {
        self.0.release_lease(fence).await
    }
}

/// The lease a paused sandbox's resume is claimed with.
pub fn resource(e2b_id: &str) -> String {
    format!("e2b-resume:{e2b_id}")
}

/// Resume claims taken as `owner` (this daemon's host id).
pub struct Claims {
    leases: Arc<dyn Leases>,
    owner: String,
}

impl Claims {
    pub fn new(leases: Arc<dyn Leases>, owner: impl Into<String>) -> Self {
        Claims {
            leases,
            owner: owner.into(),
        }
    }

    /// The claim on resuming `e2b_id`, or `None` while another daemon
    /// holds it.
    pub async fn claim(&self, e2b_id: &str) -> Result<Option<ResumeClaim>, E2bBackendError> {
        let ttl_ms = RESUME_CLAIM_TTL_S * 1000;
        match self
            .leases
            .take(&resource(e2b_id), &self.owner, ttl_ms)
            .await
        {
            Ok(l) => Ok(Some(ResumeClaim {
                resource: l.resource,
                owner: l.owner,
                epoch: l.epoch,
            })),
            Err(StoreError::LeaseHeld { .. }) => Ok(None),
            Err(e) => Err(E2bBackendError::ResumeClaim(e)),
        }
    }

    /// Gives a claim back. A failure is logged, not returned: the claim
    /// then lapses after `RESUME_CLAIM_TTL_S`.
    pub async fn release(&self, c: ResumeClaim) {
        let f = Fence {
            resource: c.resource,
            owner: c.owner,
            epoch: c.epoch,
        };
        if let Err(e) = self.leases.release(&f).await {
            tracing::warn!(resource = %f.resource, error = %e, "e2b: resume claim not released");
        }
    }
}

/// In-memory [`Leases`] for tests: leases never expire unless released;
/// `fail` makes every call answer that the database is unavailable.
#[cfg(test)]
pub(crate) mod fake {
    use super::*;
    use std::collections::HashMap;
    use std::sync::Mutex;

    #[derive(Default)]
    pub struct FakeLeases {
        /// resource -> (owner, epoch, held)
        pub held: Mutex<HashMap<String, (String, u64, bool)>>,
        pub fail: std::sync::atomic::AtomicBool,
        pub releases: Mutex<Vec<Fence>>,
    }

    impl FakeLeases {
        fn failing(&self) -> Result<(), StoreError> {
            if self.fail.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(StoreError::Unavailable("fake: down".into()));
            }
            Ok(())
        }
    }

    #[async_trait]
    impl Leases for FakeLeases {
        async fn take(
            &self,
            resource: &str,
            owner: &str,
            ttl_ms: u64,
        ) -> Result<Lease, StoreError> {
            self.failing()?;
            let mut m = self.held.lock().unwrap();
            let e = m
                .entry(resource.into())
                .or_insert((String::new(), 0, false));
            if e.2 && e.0 != owner {
                return Err(StoreError::LeaseHeld {
                    resource: resource.into(),
                    owner: e.0.clone(),
                    for_ms: ttl_ms,
                });
            }
            *e = (owner.into(), e.1 + 1, true);
            Ok(Lease {
                resource: resource.into(),
                owner: owner.into(),
                epoch: e.1,
                expires_at_ms: ttl_ms,
                valid_for_ms: ttl_ms,
            })
        }

        async fn release(&self, f: &Fence) -> Result<bool, StoreError> {
            self.releases.lock().unwrap().push(f.clone());
            self.failing()?;
            let mut m = self.held.lock().unwrap();
            match m.get_mut(&f.resource) {
                Some(e) if e.0 == f.owner && e.1 == f.epoch => {
                    e.2 = false;
                    Ok(true)
                }
                _ => Ok(false),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fake::FakeLeases;
    use super::*;
    use hatchery_e2b::backend::{BackendError, FailKind};
    use std::sync::atomic::Ordering;

    fn two_daemons() -> (Arc<FakeLeases>, Claims, Claims) {
        let l = Arc::new(FakeLeases::default());
        (
            l.clone(),
            Claims::new(l.clone(), "host-a"),
            Claims::new(l, "host-b"),
        )
    }

    #[tokio::test]
    async fn one_daemon_at_a_time_resumes_a_sandbox() {
        let (_, a, b) = two_daemons();
        let c = a.claim("e2b_x").await.unwrap().expect("free");
        assert_eq!(c.resource, "e2b-resume:e2b_x");
        assert_eq!(c.owner, "host-a");
        assert_eq!(b.claim("e2b_x").await.unwrap(), None);
        // Another sandbox is another lease.
        assert!(b.claim("e2b_y").await.unwrap().is_some());
        a.release(c.clone()).await;
        let again = b.claim("e2b_x").await.unwrap().expect("released");
        assert!(again.epoch > c.epoch);
    }

    #[tokio::test]
    async fn a_store_failure_is_an_internal_error_and_a_failed_release_lapses() {
        let (l, a, _) = two_daemons();
        let c = a.claim("e2b_x").await.unwrap().unwrap();
        l.fail.store(true, Ordering::SeqCst);
        let e = a.claim("e2b_y").await.unwrap_err();
        assert!(matches!(
            e,
            E2bBackendError::ResumeClaim(StoreError::Unavailable(_))
        ));
        let b = BackendError::from(e);
        assert_eq!(b.kind, FailKind::Internal);
        assert_eq!(b.message, "database unavailable: fake: down");
        // Logged, not returned; the fence it tried names the claim.
        a.release(c.clone()).await;
        let tried = l.releases.lock().unwrap().clone();
        assert_eq!(tried.len(), 1);
        assert_eq!(
            (tried[0].owner.as_str(), tried[0].epoch),
            ("host-a", c.epoch)
        );
    }

    #[tokio::test]
    async fn the_state_store_keeps_the_same_rules() {
        // The real store (SQLite, in memory) under the same claims.
        let store: Arc<dyn Store> = Arc::new(hatchery_store::DbStore::scratch().await.unwrap());
        let a = Claims::new(Arc::new(StoreLeases(store.clone())), "host-a");
        let b = Claims::new(Arc::new(StoreLeases(store)), "host-b");
        let c = a.claim("e2b_x").await.unwrap().expect("free");
        assert_eq!(b.claim("e2b_x").await.unwrap(), None);
        a.release(c).await;
        assert!(b.claim("e2b_x").await.unwrap().is_some());
    }
}
