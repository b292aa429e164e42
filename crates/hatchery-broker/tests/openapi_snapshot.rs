//! The broker's operator routes in OpenAPI, pinned to
//! `docs/openapi-broker.json`. After a change:
//! `UPDATE_SNAPSHOTS=1 cargo test -p hatchery-broker --test openapi_snapshot`.

use std::path::PathBuf;

#[test]
fn openapi_matches_snapshot() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi-broker.json");
    let generated = hatchery_broker::routes::openapi_json() + "\n";
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&path, &generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "docs/openapi-broker.json is stale; rerun with UPDATE_SNAPSHOTS=1 and review the diff"
    );
}
