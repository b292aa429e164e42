//! The contract every [`PolicyStore`] keeps, run against SQLite (the unit
//! tests) and PostgreSQL (tests/store_conformance.rs): numbered, immutable
//! versions; refusals that leave nothing; the built-in policy read-only;
//! concurrent writers of one policy never collide. Assertions only on what
//! each run created, so a database shared with other tests does not matter.

use crate::document::PolicyDocument;
use crate::standard::STANDARD_ID;
use crate::store::{DbPolicyStore, PolicyStore, StoreError};
use hatchery_db::{args, Db};
use std::sync::Arc;

/// The whole contract on one database, which `db` opens anew at each call
/// (as each daemon would). Two daemons starting at once on it make one
/// schema and one built-in policy; what one writes, the other reads,
/// version for version; a store opened later runs no migration twice; the
/// database itself refuses to change a written version. Returns the
/// second daemon's store and the policy it checked (at version 2).
pub async fn run_all(db: impl AsyncFn() -> Db) -> (DbPolicyStore, String) {
    let (a, b) = tokio::join!(
        DbPolicyStore::open(db().await),
        DbPolicyStore::open(db().await)
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.schema_version().await.unwrap(), 2);
    let id = versions(&a).await;
    concurrent_versions(Arc::new(a.clone())).await;
    let on_b = b.version(&id, 1).await.unwrap();
    assert_eq!(on_b.sha256, a.version(&id, 1).await.unwrap().sha256);
    assert_eq!(b.latest(&id).await.unwrap().version, 2);
    let listed = b.list().await.unwrap();
    let builtin = listed.iter().filter(|p| p.builtin).count();
    assert_eq!(builtin, 1, "one built-in policy, however many daemons");
    assert_eq!(b.latest(STANDARD_ID).await.unwrap().version, 2);
    // A migration run twice is a no-op.
    let again = DbPolicyStore::open(db().await).await.unwrap();
    assert_eq!(again.schema_version().await.unwrap(), 2);
    assert_eq!(again.latest(&id).await.unwrap().version, 2);
    versions_are_immutable(&db().await, &id).await;
    assert_eq!(b.version(&id, 1).await.unwrap().sha256, on_b.sha256);
    (b, id)
}

fn doc(name: &str, rules: serde_json::Value) -> PolicyDocument {
    serde_json::from_value(serde_json::json!({"name": name, "rules": rules})).unwrap()
}

/// Versions, reads, refusals and listing. Returns the policy it created
/// (at version 2), for backend-specific checks after.
async fn versions(s: &dyn PolicyStore) -> String {
    use serde_json::json;
    let a = doc("a", json!([{"id": "r", "effect": "allow"}]));
    let p1 = s.create(a, None).await.unwrap();
    assert_eq!(p1.version, 1);
    assert!(p1.id.starts_with("pol_") && p1.id.len() == 20);
    assert!(!p1.builtin);
    let a2 = doc("a2", json!([{"id": "r", "effect": "deny"}]));
    let p2 = s.add_version(&p1.id, a2).await.unwrap();
    assert_eq!(p2.version, 2);
    assert_ne!(p1.sha256, p2.sha256);
    let latest = s.latest(&p1.id).await.unwrap();
    assert_eq!((latest.version, &latest.sha256), (2, &p2.sha256));
    let old = s.version(&p1.id, 1).await.unwrap();
    assert_eq!(old.document, p1.document, "version 1 is unchanged");
    assert_eq!(old.sha256, p1.sha256);
    assert_eq!(old.created_at, p1.created_at);
    let d1 = || p1.document.clone();
    let e = s.version(&p1.id, 3).await.unwrap_err();
    assert!(matches!(e, StoreError::VersionNotFound(_, 3)), "{e:?}");
    for r in [
        s.version("pol_nope", 1).await,
        s.latest("pol_nope").await,
        s.add_version("pol_nope", d1()).await,
    ] {
        assert!(matches!(r, Err(StoreError::NotFound(_))), "{r:?}");
    }
    let e = s.add_version(STANDARD_ID, d1()).await.unwrap_err();
    assert!(matches!(e, StoreError::ReadOnly(_)), "{e:?}");
    let rules = json!([{"id": "ok", "effect": "allow"}, {"id": "BAD", "effect": "deny"}]);
    let bad = doc("b", rules);
    let before = s.list().await.unwrap().len();
    for r in [
        s.create(bad.clone(), None).await,
        s.add_version(&p1.id, bad).await,
    ] {
        assert!(matches!(r, Err(StoreError::Invalid(_))), "{r:?}");
    }
    let latest = s.latest(&p1.id).await.unwrap().version;
    assert_eq!(latest, 2, "a refused version leaves nothing");
    let list = s.list().await.unwrap();
    assert_eq!(list.len(), before, "a refused create leaves nothing");
    let mine = list.iter().find(|p| p.id == p1.id).unwrap();
    assert_eq!((mine.name.as_str(), mine.latest_version), ("a2", 2));
    assert!(list.iter().any(|p| p.id == STANDARD_ID && p.builtin));
    let std = s.latest(STANDARD_ID).await.unwrap();
    assert!(std.builtin && std.version >= 1);
    p1.id
}

/// Twenty writers add a version to one policy at once: each gets its own
/// number, 2..=21, and the latest is 21. The policy is a tenant's: every
/// version stays its, and the list says whose it is.
async fn concurrent_versions(s: Arc<dyn PolicyStore>) {
    let c = || doc("c", serde_json::json!([]));
    let p = s.create(c(), Some("ten_c")).await.unwrap();
    assert_eq!(p.tenant.as_deref(), Some("ten_c"));
    let mut got = hatchery_db::race(20, |_| {
        let (s, id, doc) = (s.clone(), p.id.clone(), c());
        async move { s.add_version(&id, doc).await.unwrap().version }
    })
    .await;
    got.sort();
    assert_eq!(got, (2..=21).collect::<Vec<_>>());
    let latest = s.latest(&p.id).await.unwrap();
    assert_eq!(
        (latest.version, latest.tenant.as_deref()),
        (21, Some("ten_c"))
    );
    let listed = s.list().await.unwrap();
    let head = listed.iter().find(|h| h.id == p.id).unwrap();
    assert_eq!(head.tenant.as_deref(), Some("ten_c"));
    assert!(listed.iter().all(|h| h.id == p.id || h.tenant.is_none()));
}

/// The database itself refuses to rewrite or drop a written version of
/// `id`: immutability is its rule, not only the store's.
async fn versions_are_immutable(db: &Db, id: &str) {
    for sql in [
        "UPDATE policy_versions SET document = '{}' WHERE policy_id = $1",
        "DELETE FROM policy_versions WHERE policy_id = $1",
    ] {
        let e = db.execute(sql, args![id]).await.unwrap_err();
        assert!(e.to_string().contains("immutable"), "{e}");
        assert!(e.refused_by_schema(), "{e:?}");
    }
}
