//! The sessions OpenAPI document is generated from code; this pins it to
//! `docs/openapi-sessions.json` (the SDKs follow it). After an API change:
//! `UPDATE_SNAPSHOTS=1 cargo test -p hatchery-sessions --test openapi_snapshot`.

#[test]
fn openapi_matches_snapshot() {
    hatchery_serve::openapi_pin::pin(
        env!("CARGO_MANIFEST_DIR"),
        "docs/openapi-sessions.json",
        &hatchery_sessions::openapi::json(),
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
