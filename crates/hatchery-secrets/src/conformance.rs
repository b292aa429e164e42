//! Owners and the migration to them, one check both databases run: the
//! SQLite unit test (`store.rs`) and `tests/store_postgres.rs`.

use crate::store::SCHEMA;
use crate::{Listing, SecretKey, Secrets, StoreError};
use hatchery_db::{args, Db, Migrations};

/// Migration 2 keeps the rows step 1 stored as the operator's, and each
/// owner's names are its own. `db` must be empty.
pub async fn owners_and_the_migration(db: Db) {
    let key = SecretKey::from_bytes([3; 32]);
    // The table as step 1 made it, with a row sealed to its name.
    db.migrate(&Migrations {
        product: "secrets",
        steps: &SCHEMA.steps[..1],
    })
    .await
    .unwrap();
    let sealed = crate::seal::seal(&key, "OLD", b"old-value").unwrap();
    db.execute(
        "INSERT INTO secrets (name, sealed, key_id, bytes, created_at) VALUES ('OLD', $1, $2, 9, 'then')",
        args![sealed, key.id()],
    )
    .await
    .unwrap();
    let s = Secrets::open(db, key).await.unwrap();
    assert_eq!(&s.reveal(None, "OLD").await.unwrap()[..], b"old-value");
    assert!(matches!(
        s.reveal(Some("ten_a"), "OLD").await,
        Err(StoreError::NotFound(_))
    ));
    // The same name for two owners; a duplicate within one.
    s.create(Some("ten_a"), "OLD", "a-value").await.unwrap();
    assert!(matches!(
        s.create(Some("ten_a"), "OLD", "again").await,
        Err(StoreError::Exists(_))
    ));
    assert_eq!(
        &s.reveal(Some("ten_a"), "OLD").await.unwrap()[..],
        b"a-value"
    );
    assert_eq!(&s.reveal(None, "OLD").await.unwrap()[..], b"old-value");
    let all = s.list(Listing::All).await.unwrap();
    let owners: Vec<_> = all.iter().map(|i| i.tenant.clone()).collect();
    assert_eq!(owners, vec![None, Some("ten_a".to_string())]);
    assert_eq!(s.list(Listing::Of(Some("ten_b"))).await.unwrap(), vec![]);
    assert!(matches!(
        s.delete(Some("ten_b"), "OLD").await,
        Err(StoreError::NotFound(_))
    ));
    s.delete(Some("ten_a"), "OLD").await.unwrap();
    assert_eq!(&s.reveal(None, "OLD").await.unwrap()[..], b"old-value");
}
