//! The contract every [`TenantStore`] keeps, run against SQLite (the unit
//! tests) and PostgreSQL (tests/store_conformance.rs): tenants read back as
//! written; a refused request leaves nothing; keys are found by hash only
//! while unrevoked and their tenant exists; the unrevoked-keys cap holds
//! under concurrent creates. Assertions only on what each run created, so
//! a database shared with other tests does not matter.

use crate::model::{Limits, NewTenant, TenantPatch, MAX_ACTIVE_KEYS};
use crate::store::{DbTenantStore, StoreError, TenantStore};
use hatchery_db::Db;
use std::sync::Arc;

/// The whole contract on one database, which `db` opens anew at each call
/// (as each daemon would). Returns the second daemon's store.
pub async fn run_all(db: impl AsyncFn() -> Db) -> DbTenantStore {
    let (a, b) = tokio::join!(
        DbTenantStore::open(db().await),
        DbTenantStore::open(db().await)
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.schema_version().await.unwrap(), 1);
    let id = tenants(&a).await;
    assert_eq!(
        b.get(&id).await.unwrap().name,
        "acme-2",
        "one daemon reads the other's writes"
    );
    keys(&a, &b).await;
    key_cap_under_race(Arc::new(a.clone())).await;
    let again = DbTenantStore::open(db().await).await.unwrap();
    assert_eq!(
        again.schema_version().await.unwrap(),
        1,
        "a migration runs once"
    );
    b
}

fn new(name: &str, limits: Limits) -> NewTenant {
    NewTenant {
        name: name.into(),
        limits,
    }
}

async fn tenants(s: &dyn TenantStore) -> String {
    let limits = Limits {
        tokens: Some(10_000),
        live_sandboxes: Some(2),
        ..Limits::default()
    };
    let t = s.create(new("acme", limits.clone())).await.unwrap();
    assert!(t.id.starts_with("ten_") && t.id.len() == 20, "{}", t.id);
    assert_eq!(s.get(&t.id).await.unwrap(), t);
    assert!(s.list().await.unwrap().contains(&t));
    // Refusals leave nothing.
    let before = s.list().await.unwrap().len();
    let bad = Limits {
        live_sandboxes: Some(u64::MAX),
        ..Limits::default()
    };
    for r in [
        s.create(new("", Limits::default())).await,
        s.create(new("x", bad.clone())).await,
    ] {
        assert!(matches!(r, Err(StoreError::Invalid(_))), "{r:?}");
    }
    assert_eq!(s.list().await.unwrap().len(), before);
    let patch = |name: Option<&str>, limits: Option<Limits>| TenantPatch {
        name: name.map(Into::into),
        limits,
    };
    let r = s.update(&t.id, patch(Some("ok"), Some(bad))).await;
    assert!(matches!(r, Err(StoreError::Invalid(_))), "{r:?}");
    assert_eq!(
        s.get(&t.id).await.unwrap(),
        t,
        "a refused patch changes nothing"
    );
    // A name alone keeps the limits; limits replace all five.
    let u = s.update(&t.id, patch(Some("acme-2"), None)).await.unwrap();
    assert_eq!((u.name.as_str(), &u.limits), ("acme-2", &limits));
    let only = Limits {
        concurrent_sessions: Some(0),
        ..Limits::default()
    };
    let u = s
        .update(&t.id, patch(None, Some(only.clone())))
        .await
        .unwrap();
    assert_eq!(s.get(&t.id).await.unwrap().limits, only);
    assert_eq!(u.name, "acme-2");
    for r in [
        s.get("ten_nope").await.map(|_| ()),
        s.update("ten_nope", TenantPatch::default())
            .await
            .map(|_| ()),
        s.delete("ten_nope").await,
        s.list_keys("ten_nope").await.map(|_| ()),
        s.add_key("ten_nope", "h", "p").await.map(|_| ()),
    ] {
        assert!(matches!(r, Err(StoreError::NotFound(_))), "{r:?}");
    }
    t.id
}

async fn keys(a: &dyn TenantStore, b: &dyn TenantStore) {
    let t = a.create(new("keys", Limits::default())).await.unwrap();
    let u = a.create(new("other", Limits::default())).await.unwrap();
    let hash = |n: u64| format!("{:064x}", rand::random::<u64>() ^ n);
    let (h1, h2) = (hash(1), hash(2));
    let k1 = a.add_key(&t.id, &h1, "htk_11111111").await.unwrap();
    let k2 = a.add_key(&t.id, &h2, "htk_22222222").await.unwrap();
    assert!(k1.id.starts_with("key_") && k1.revoked_at.is_none());
    let owner = b.owner(&h1).await.unwrap().unwrap();
    assert_eq!(
        (owner.tenant.as_str(), owner.key_id.as_str()),
        (t.id.as_str(), k1.id.as_str())
    );
    assert_eq!(b.owner(&hash(3)).await.unwrap(), None);
    let listed = b.list_keys(&t.id).await.unwrap();
    assert_eq!(listed, vec![k1.clone(), k2.clone()]);
    // Another tenant's key is not found under this one.
    let r = a.revoke_key(&u.id, &k1.id).await;
    assert!(matches!(r, Err(StoreError::KeyNotFound { .. })), "{r:?}");
    assert!(b.owner(&h1).await.unwrap().is_some());
    let r1 = a.revoke_key(&t.id, &k1.id).await.unwrap();
    assert!(r1.revoked_at.is_some());
    assert_eq!(
        b.owner(&h1).await.unwrap(),
        None,
        "a revoked key is nobody's"
    );
    let again = a.revoke_key(&t.id, &k1.id).await.unwrap();
    assert_eq!(
        again.revoked_at, r1.revoked_at,
        "revoking twice changes nothing"
    );
    assert!(b.owner(&h2).await.unwrap().is_some());
    a.delete(&t.id).await.unwrap();
    assert_eq!(
        b.owner(&h2).await.unwrap(),
        None,
        "a deleted tenant's keys go with it"
    );
    assert!(matches!(b.get(&t.id).await, Err(StoreError::NotFound(_))));
    a.delete(&u.id).await.unwrap();
}

/// Thirty keys made at once for one tenant: exactly the cap succeed, the
/// rest are TooManyKeys; after a revoke there is room for one more.
async fn key_cap_under_race(s: Arc<dyn TenantStore>) {
    let t = s.create(new("race", Limits::default())).await.unwrap();
    let got = hatchery_db::race(30, |i| {
        let (s, id) = (s.clone(), t.id.clone());
        async move {
            s.add_key(
                &id,
                &format!("{:064x}", rand::random::<u64>() ^ i as u64),
                "htk_x",
            )
            .await
        }
    })
    .await;
    let ok: Vec<_> = got.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(ok.len() as u64, MAX_ACTIVE_KEYS);
    for r in &got {
        if let Err(e) = r {
            assert!(matches!(e, StoreError::TooManyKeys(..)), "{e:?}");
        }
    }
    let r = s.add_key(&t.id, "extra", "htk_x").await;
    assert!(matches!(r, Err(StoreError::TooManyKeys(..))), "{r:?}");
    s.revoke_key(&t.id, &ok[0].id).await.unwrap();
    s.add_key(&t.id, "extra", "htk_x").await.unwrap();
    s.delete(&t.id).await.unwrap();
}
