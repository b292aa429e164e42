//! The OpenAPI document is generated from code; this pins it to
//! `docs/openapi.json`, which the SDKs are checked against. A change to the
//! API shows up here as a diff to review and commit:
//! `UPDATE_SNAPSHOTS=1 cargo test -p hatchery-api --test openapi_snapshot`.

#[test]
fn openapi_matches_snapshot() {
    hatchery_serve::openapi_pin::pin(
        env!("CARGO_MANIFEST_DIR"),
        "docs/openapi.json",
        &hatchery_api::openapi::json(),
    );
}

#[test]
fn every_route_is_documented() {
    let doc: serde_json::Value = serde_json::from_str(&hatchery_api::openapi::json()).unwrap();
    let paths = doc["paths"].as_object().unwrap();
    for p in [
        "/v1/sandboxes",
        "/v1/sandboxes/{id}",
        "/v1/sandboxes/{id}/files",
        "/v1/sandboxes/{id}/files/list",
        "/v1/sandboxes/{id}/exec",
        "/v1/sandboxes/{id}/exec/stream",
        "/v1/sandboxes/{id}/code",
        "/v1/sandboxes/{id}/code/stream",
        "/v1/sandboxes/{id}/code/contexts",
        "/v1/sandboxes/{id}/code/contexts/{context_id}",
        "/v1/sandboxes/{id}/code/contexts/{context_id}/restart",
        "/v1/sandboxes/{id}/ports/{port}/{path}",
        "/v1/sandboxes/{id}/ports/{port}/preview-url",
        "/preview/{token}/{path}",
        "/healthz",
        "/metrics",
        "/v1/policies",
        "/v1/policies/{id}",
        "/v1/policies/{id}/versions",
        "/v1/policies/{id}/versions/{version}",
    ] {
        assert!(paths.contains_key(p), "{p} missing from OpenAPI");
    }
    // Port relays take every method, WebSocket upgrades (101) included.
    for p in [
        "/v1/sandboxes/{id}/ports/{port}/{path}",
        "/preview/{token}/{path}",
    ] {
        for m in ["get", "post", "put", "delete", "patch", "head", "options"] {
            assert!(paths[p].get(m).is_some(), "{m} {p} missing");
        }
        assert!(
            paths[p]["get"]["responses"].get("101").is_some(),
            "{p}: no 101"
        );
    }
    assert!(paths["/preview/{token}/{path}"]["get"]["security"] == serde_json::json!([{}]));
    let exec = &doc["components"]["schemas"]["ExecResponse"]["properties"];
    for f in [
        "exit_code",
        "stdout",
        "stderr",
        "timed_out",
        "truncated",
        "oom_killed",
        "duration_ms",
        "cpu_ms",
        "reason",
        "memory_peak_bytes",
        "contained",
    ] {
        assert!(exec.get(f).is_some(), "ExecResponse.{f} missing");
    }
}
