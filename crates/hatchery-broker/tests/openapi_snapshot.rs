//! The broker's operator routes in OpenAPI, pinned to
//! `docs/openapi-broker.json`. After a change:
//! `UPDATE_SNAPSHOTS=1 cargo test -p hatchery-broker --test openapi_snapshot`.

#[test]
fn openapi_matches_snapshot() {
    hatchery_serve::openapi_pin::pin(
        env!("CARGO_MANIFEST_DIR"),
        "docs/openapi-broker.json",
        &hatchery_broker::routes::openapi_json(),
    );
}
