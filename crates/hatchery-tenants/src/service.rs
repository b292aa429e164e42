//! [`Tenants`]: the store plus what the API needs per request. Resolving a
//! bearer key to a [`Principal`] (a small cache in front of the store,
//! emptied of a key when this daemon revokes it or deletes its tenant, so
//! a revoke is effective at once here; other daemons of a deployment keep
//! a cached answer at most [`CACHE_TTL`]). And the admission gate of
//! creates: a tenant's creates take turns through its gate while they
//! count what it holds (live, plus admitted and still being made) against
//! its limit, so concurrent creates cannot pass the limit together.

use crate::keys;
use crate::model::{Limits, Tenant};
use crate::store::{StoreError, TenantStore};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a resolved key is trusted without asking the store again.
pub const CACHE_TTL: Duration = Duration::from_secs(5);
/// Most keys cached; a full cache is emptied (misses are never cached).
pub const CACHE_ENTRIES: usize = 4096;

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// The deployment's API key: sees and acts on everything.
    Operator,
    /// A tenant's key: its own resources only.
    Tenant(String),
}

impl Principal {
    pub fn tenant(&self) -> Option<&str> {
        match self {
            Principal::Operator => None,
            Principal::Tenant(t) => Some(t),
        }
    }
}

/// What a tenant holds now, as the products that hold it count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub live_sandboxes: u64,
    pub live_sessions: u64,
}

#[derive(Debug, thiserror::Error)]
#[error("counting what tenant {tenant} holds")]
pub struct UsageError {
    pub tenant: String,
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

/// Counts a tenant's live resources (the daemon implements it over its
/// sandboxes; a fake in tests).
#[async_trait::async_trait]
pub trait LiveUsage: Send + Sync + 'static {
    async fn usage(&self, tenant: &str) -> Result<Usage, UsageError>;
}

/// What several products count, added up: each counts what it holds
/// (the manager its sandboxes, the sessions their unfinished sessions).
pub struct SumUsage(pub Vec<Arc<dyn LiveUsage>>);

#[async_trait::async_trait]
impl LiveUsage for SumUsage {
    async fn usage(&self, tenant: &str) -> Result<Usage, UsageError> {
        let mut sum = Usage::default();
        for u in &self.0 {
            let one = u.usage(tenant).await?;
            sum.live_sandboxes += one.live_sandboxes;
            sum.live_sessions += one.live_sessions;
        }
        Ok(sum)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AdmitError {
    #[error("tenant {tenant} is at its {limit} limit of {max} ({in_use} in use)")]
    Limit {
        tenant: String,
        limit: &'static str,
        max: u64,
        in_use: u64,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Usage(#[from] UsageError),
}

#[derive(Debug, thiserror::Error)]
pub enum DeleteError {
    #[error("tenant {tenant} still has {sandboxes} live sandboxes and {sessions} live sessions")]
    InUse {
        tenant: String,
        sandboxes: u64,
        sessions: u64,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Usage(#[from] UsageError),
}

struct Gate {
    turn: tokio::sync::Mutex<()>,
    /// Admitted and not yet made (or failed); watched, so an admission
    /// that must count exactly can wait for those in flight to settle.
    pending: tokio::sync::watch::Sender<u64>,
}

impl Default for Gate {
    fn default() -> Self {
        Gate {
            turn: tokio::sync::Mutex::new(()),
            pending: tokio::sync::watch::Sender::new(0),
        }
    }
}

/// Longest an admission waits for a tenant's creates in flight to settle
/// before it refuses on the count it has.
pub const SETTLE_WAIT: Duration = Duration::from_secs(120);

/// An admitted create; dropping it (made or failed) releases its place.
pub struct Admission {
    gate: Arc<Gate>,
    n: u64,
}

impl Drop for Admission {
    fn drop(&mut self) {
        let n = self.n;
        self.gate.pending.send_modify(|p| *p = p.saturating_sub(n));
    }
}

struct Cached {
    tenant: String,
    key_id: String,
    at: Instant,
}

pub struct Tenants {
    pub store: Arc<dyn TenantStore>,
    usage: Arc<dyn LiveUsage>,
    cache: Mutex<HashMap<String, Cached>>,
    gates: Mutex<HashMap<String, Arc<Gate>>>,
}

impl Tenants {
    pub fn new(store: Arc<dyn TenantStore>, usage: Arc<dyn LiveUsage>) -> Tenants {
        Tenants {
            store,
            usage,
            cache: Mutex::new(HashMap::new()),
            gates: Mutex::new(HashMap::new()),
        }
    }

    /// The tenant a non-operator bearer key belongs to, or `None` (not a
    /// tenant key, unknown, revoked, or its tenant deleted).
    pub async fn resolve(&self, bearer: &str) -> Result<Option<Principal>, StoreError> {
        if !keys::well_formed(bearer) {
            return Ok(None);
        }
        let hash = keys::hash(bearer);
        if let Some(c) = self.lock_cache().get(&hash) {
            if c.at.elapsed() < CACHE_TTL {
                return Ok(Some(Principal::Tenant(c.tenant.clone())));
            }
        }
        let Some(owner) = self.store.owner(&hash).await? else {
            self.lock_cache().remove(&hash);
            return Ok(None);
        };
        let mut cache = self.lock_cache();
        if cache.len() >= CACHE_ENTRIES {
            cache.clear();
        }
        let tenant = owner.tenant.clone();
        cache.insert(
            hash,
            Cached {
                tenant: owner.tenant,
                key_id: owner.key_id,
                at: Instant::now(),
            },
        );
        Ok(Some(Principal::Tenant(tenant)))
    }

    fn lock_cache(&self) -> std::sync::MutexGuard<'_, HashMap<String, Cached>> {
        // A panic while holding it left a map, never a broken invariant.
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn gate(&self, tenant: &str) -> Arc<Gate> {
        let mut gates = self.gates.lock().unwrap_or_else(|e| e.into_inner());
        gates.entry(tenant.to_string()).or_default().clone()
    }

    /// Makes a key for `tenant`: the answer holds the key, which is not
    /// stored and cannot be shown again.
    pub async fn create_key(&self, tenant: &str) -> Result<crate::model::CreatedKey, StoreError> {
        let (key, hash) = keys::generate();
        let info = self
            .store
            .add_key(tenant, &hash, &keys::display_prefix(&key))
            .await?;
        Ok(crate::model::CreatedKey { info, key })
    }

    /// Revokes a key; from now on this daemon refuses it.
    pub async fn revoke_key(
        &self,
        tenant: &str,
        key_id: &str,
    ) -> Result<crate::model::TenantKey, StoreError> {
        let k = self.store.revoke_key(tenant, key_id).await?;
        self.lock_cache().retain(|_, c| c.key_id != key_id);
        Ok(k)
    }

    /// Deletes a tenant that holds nothing live (through its gate, so no
    /// create of it is admitted meanwhile), with all its keys.
    pub async fn delete(&self, tenant: &str) -> Result<(), DeleteError> {
        let gate = self.gate(tenant);
        let _turn = gate.turn.lock().await;
        self.store.get(tenant).await?;
        let u = self.usage.usage(tenant).await?;
        let pending = *gate.pending.borrow();
        if u.live_sandboxes + pending > 0 || u.live_sessions > 0 {
            return Err(DeleteError::InUse {
                tenant: tenant.into(),
                sandboxes: u.live_sandboxes + pending,
                sessions: u.live_sessions,
            });
        }
        self.store.delete(tenant).await?;
        self.lock_cache().retain(|_, c| c.tenant != tenant);
        Ok(())
    }

    /// Admits the creation of `n` sandboxes for `tenant` if its
    /// `live_sandboxes` limit has room for them. Hold the answer until the
    /// sandboxes exist (or failed): until then they count as pending.
    ///
    /// A create in flight may already be in the live count as well as
    /// pending, so `live + pending` can count it twice. That sum admits
    /// when it fits (it is never low); when it does not fit and creates
    /// are in flight, the admission waits (holding the tenant's turn) for
    /// them to settle and counts again, so a refusal is on an exact count.
    pub async fn admit_sandboxes(&self, tenant: &str, n: u64) -> Result<Admission, AdmitError> {
        let gate = self.gate(tenant);
        let _turn = gate.turn.lock().await;
        let t: Tenant = self.store.get(tenant).await?;
        if let Some(max) = t.limits.live_sandboxes {
            let mut settled = gate.pending.subscribe();
            let deadline = tokio::time::Instant::now() + SETTLE_WAIT;
            loop {
                let pending = *settled.borrow_and_update();
                let live = self.usage.usage(tenant).await?.live_sandboxes;
                if live + pending + n <= max {
                    break;
                }
                let settle = tokio::time::timeout_at(deadline, settled.changed());
                if pending == 0 || !matches!(settle.await, Ok(Ok(()))) {
                    return Err(AdmitError::Limit {
                        tenant: tenant.into(),
                        limit: "live_sandboxes",
                        max,
                        in_use: live + pending,
                    });
                }
            }
        }
        gate.pending.send_modify(|p| *p += n);
        Ok(Admission {
            gate: gate.clone(),
            n,
        })
    }

    pub async fn limits(&self, tenant: &str) -> Result<Limits, StoreError> {
        Ok(self.store.get(tenant).await?.limits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::NewTenant;
    use crate::store::DbTenantStore;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Sandboxes counted live by a fake: what `made` says.
    struct Fake {
        made: Arc<AtomicU64>,
    }

    #[async_trait::async_trait]
    impl LiveUsage for Fake {
        async fn usage(&self, _: &str) -> Result<Usage, UsageError> {
            Ok(Usage {
                live_sandboxes: self.made.load(Ordering::SeqCst),
                live_sessions: 0,
            })
        }
    }

    async fn setup(limit: Option<u64>) -> (Arc<Tenants>, String, Arc<AtomicU64>) {
        let store = Arc::new(DbTenantStore::scratch().await.unwrap());
        let made = Arc::new(AtomicU64::new(0));
        let t = Tenants::new(store.clone(), Arc::new(Fake { made: made.clone() }));
        let limits = Limits {
            live_sandboxes: limit,
            ..Limits::default()
        };
        let new = NewTenant {
            name: "a".into(),
            limits,
        };
        let id = store.create(new).await.unwrap().id;
        (Arc::new(t), id, made)
    }

    /// Eight creates at once under a limit of 3, each "made" only after
    /// a yield: exactly three are admitted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_admissions_never_pass_the_limit() {
        let (t, id, made) = setup(Some(3)).await;
        let got = hatchery_db::race(8, |_| {
            let (t, id, made) = (t.clone(), id.clone(), made.clone());
            async move {
                let a = t.admit_sandboxes(&id, 1).await?;
                tokio::time::sleep(Duration::from_millis(20)).await;
                made.fetch_add(1, Ordering::SeqCst);
                drop(a);
                Ok::<_, AdmitError>(())
            }
        })
        .await;
        let ok = got.iter().filter(|r| r.is_ok()).count();
        assert_eq!(ok, 3);
        for r in got.iter().filter_map(|r| r.as_ref().err()) {
            assert!(
                matches!(
                    r,
                    AdmitError::Limit {
                        limit: "live_sandboxes",
                        max: 3,
                        ..
                    }
                ),
                "{r:?}"
            );
        }
        // A refusal while a create is in flight waits for it: here it
        // fails (made nothing), so the waiting one gets its place.
        made.store(2, Ordering::SeqCst);
        let a = t.admit_sandboxes(&id, 1).await.unwrap();
        let waiter = tokio::spawn({
            let (t, id) = (t.clone(), id.clone());
            async move { t.admit_sandboxes(&id, 1).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "waits for the create in flight");
        drop(a);
        let b = waiter.await.unwrap().unwrap();
        made.store(3, Ordering::SeqCst);
        drop(b);
        // Nothing in flight: refused at once, on the exact count.
        let r = t.admit_sandboxes(&id, 1).await;
        assert!(
            matches!(r, Err(AdmitError::Limit { in_use: 3, .. })),
            "{:?}",
            r.err()
        );
        made.store(1, Ordering::SeqCst);
        t.admit_sandboxes(&id, 2).await.unwrap();
    }

    /// The manager records a sandbox before its create returns, so for a
    /// while it is both live and pending. Four creates at once under a
    /// limit of 2, each live as soon as admitted: exactly two are made,
    /// none refused on the double count.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_sandbox_both_live_and_pending_is_not_counted_twice() {
        let (t, id, made) = setup(Some(2)).await;
        let got = hatchery_db::race(4, |_| {
            let (t, id, made) = (t.clone(), id.clone(), made.clone());
            async move {
                let a = t.admit_sandboxes(&id, 1).await?;
                made.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                drop(a);
                Ok::<_, AdmitError>(())
            }
        })
        .await;
        assert_eq!(got.iter().filter(|r| r.is_ok()).count(), 2, "{got:?}");
        assert_eq!(made.load(Ordering::SeqCst), 2);
    }

    /// Sessions: a fake that counts `n` unfinished.
    struct Sessions(u64);

    #[async_trait::async_trait]
    impl LiveUsage for Sessions {
        async fn usage(&self, _: &str) -> Result<Usage, UsageError> {
            Ok(Usage {
                live_sandboxes: 0,
                live_sessions: self.0,
            })
        }
    }

    /// A tenant with an unfinished session and no sandbox is in use; the
    /// sum counts each product's share once.
    #[tokio::test]
    async fn a_delete_counts_every_product_s_share() {
        let store = Arc::new(DbTenantStore::scratch().await.unwrap());
        let made = Arc::new(AtomicU64::new(0));
        let sum = SumUsage(vec![
            Arc::new(Fake { made: made.clone() }),
            Arc::new(Sessions(1)),
        ]);
        assert_eq!(
            sum.usage("ten_x").await.unwrap(),
            Usage {
                live_sandboxes: 0,
                live_sessions: 1
            }
        );
        let t = Tenants::new(store.clone(), Arc::new(sum));
        let new = NewTenant {
            name: "a".into(),
            limits: Limits::default(),
        };
        let id = store.create(new).await.unwrap().id;
        let r = t.delete(&id).await;
        assert!(
            matches!(
                r,
                Err(DeleteError::InUse {
                    sessions: 1,
                    sandboxes: 0,
                    ..
                })
            ),
            "{r:?}"
        );
        store.get(&id).await.unwrap();
        let t = Tenants::new(
            store.clone(),
            Arc::new(SumUsage(vec![Arc::new(Sessions(0))])),
        );
        t.delete(&id).await.unwrap();
    }

    #[tokio::test]
    async fn no_limit_admits_and_unknown_tenants_do_not() {
        let (t, id, _) = setup(None).await;
        t.admit_sandboxes(&id, 1000).await.unwrap();
        let r = t.admit_sandboxes("ten_nope", 1).await;
        assert!(matches!(r, Err(AdmitError::Store(StoreError::NotFound(_)))));
    }

    #[tokio::test]
    async fn keys_resolve_until_revoked_and_deletes_need_nothing_live() {
        let (t, id, made) = setup(None).await;
        let k = t.create_key(&id).await.unwrap();
        assert!(keys::well_formed(&k.key));
        let me = Some(Principal::Tenant(id.clone()));
        assert_eq!(t.resolve(&k.key).await.unwrap(), me);
        assert_eq!(t.resolve(&k.key).await.unwrap(), me, "cached");
        assert_eq!(t.resolve("hx_operator").await.unwrap(), None);
        let (other, _) = keys::generate();
        assert_eq!(t.resolve(&other).await.unwrap(), None);
        t.revoke_key(&id, &k.info.id).await.unwrap();
        assert_eq!(t.resolve(&k.key).await.unwrap(), None, "refused at once");
        let k2 = t.create_key(&id).await.unwrap();
        assert_eq!(t.resolve(&k2.key).await.unwrap(), me);
        made.store(1, Ordering::SeqCst);
        let r = t.delete(&id).await;
        assert!(
            matches!(r, Err(DeleteError::InUse { sandboxes: 1, .. })),
            "{r:?}"
        );
        assert_eq!(
            t.resolve(&k2.key).await.unwrap(),
            me,
            "a refused delete keeps keys"
        );
        made.store(0, Ordering::SeqCst);
        t.delete(&id).await.unwrap();
        assert_eq!(t.resolve(&k2.key).await.unwrap(), None);
    }
}
