//! The hosts API's OpenAPI document is generated from code; this pins it
//! to `docs/openapi-hosts.json`. After an API change:
//! `UPDATE_SNAPSHOTS=1 cargo test -p hatchery-hosts --test openapi_snapshot`.

#[test]
fn openapi_matches_snapshot() {
    hatchery_serve::openapi_pin::pin(
        env!("CARGO_MANIFEST_DIR"),
        "docs/openapi-hosts.json",
        &hatchery_hosts::openapi::json(),
    );
}

#[test]
fn the_operator_routes_are_there() {
    let doc: serde_json::Value = serde_json::from_str(&hatchery_hosts::openapi::json()).unwrap();
    let paths = doc["paths"].as_object().unwrap();
    for p in [
        "/v1/hosts",
        "/v1/hosts/{id}",
        "/v1/hosts/{id}:cordon",
        "/v1/hosts/{id}:uncordon",
        "/v1/hosts/{id}:drain",
        "/readyz",
    ] {
        assert!(paths.contains_key(p), "{p} missing");
    }
    let host = &doc["components"]["schemas"]["Host"]["properties"];
    for f in [
        "id",
        "address",
        "state",
        "live_sandboxes",
        "live_sessions",
        "capacity",
        "heartbeat_age_ms",
        "version",
    ] {
        assert!(host.get(f).is_some(), "Host.{f}");
    }
}
