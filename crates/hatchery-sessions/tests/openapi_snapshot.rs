//! The sessions OpenAPI document is generated from code; this pins it to
//! `docs/openapi-sessions.json` (the SDKs follow it). After an API change:
//! `UPDATE_SNAPSHOTS=1 cargo test -p hatchery-sessions --test openapi_snapshot`.

use std::path::PathBuf;

#[test]
fn openapi_matches_snapshot() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi-sessions.json");
    let generated = hatchery_sessions::openapi::json() + "\n";
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&path, &generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "docs/openapi-sessions.json is stale; rerun with UPDATE_SNAPSHOTS=1 and review the diff"
    );
}

#[test]
fn every_route_is_documented() {
    let doc: serde_json::Value = serde_json::from_str(&hatchery_sessions::openapi::json()).unwrap();
    let paths = doc["paths"].as_object().unwrap();
    for p in [
        "/v1/sessions",
        "/v1/sessions/{id}",
        "/v1/sessions/{id}:cancel",
        "/v1/sessions/{id}/events",
        "/v1/sessions/{id}/messages",
        "/v1/sessions/{id}/approvals/{aid}",
        "/v1/sessions/{id}/blobs/{blob_ref}",
        "/v1/environments",
        "/v1/environments/{id}",
        "/v1/environments/{id}:build",
    ] {
        assert!(
            paths.contains_key(p),
            "{p} missing from the OpenAPI document"
        );
    }
}
