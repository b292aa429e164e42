//! The rounds OpenAPI document is generated from code; this pins it to
//! `docs/openapi-rounds.json`, which the SDKs follow. After an API change:
//! `UPDATE_SNAPSHOTS=1 cargo test -p hatchery-rounds --test openapi_snapshot`.

#[test]
fn openapi_matches_snapshot() {
    hatchery_serve::openapi_pin::pin(
        env!("CARGO_MANIFEST_DIR"),
        "docs/openapi-rounds.json",
        &hatchery_rounds::openapi::json(),
    );
}

#[test]
fn the_issue_wire_names_are_there() {
    let doc: serde_json::Value = serde_json::from_str(&hatchery_rounds::openapi::json()).unwrap();
    let paths = doc["paths"].as_object().unwrap();
    for p in [
        "/v1/rounds",
        "/v1/rounds/{id}/sessions",
        "/v1/rounds/{id}/sessions/{sid}/run",
        "/v1/rounds/{id}/sessions/{sid}/run/stream",
        "/v1/rounds/{id}/sessions/{sid}/submit",
        "/v1/rounds/{id}/sessions/{sid}/report",
    ] {
        assert!(paths.contains_key(p), "{p} missing");
    }
    let s = &doc["components"]["schemas"];
    for f in [
        "stdout",
        "stderr",
        "exit_code",
        "cpu_ms",
        "wall_ms",
        "memory_peak_bytes",
        "verdict",
    ] {
        assert!(
            s["RunResult"]["properties"].get(f).is_some(),
            "RunResult.{f}"
        );
    }
    for f in ["passed", "total", "failed_cases"] {
        assert!(
            s["CandidateResult"]["properties"].get(f).is_some(),
            "CandidateResult.{f}"
        );
    }
    let cr = &s["CreateRound"]["properties"];
    for f in [
        "name",
        "template",
        "starter_files",
        "tests",
        "cpu_time_limit_ms",
        "wall_time_limit_ms",
        "run_mode",
        "setup",
        "retention_seconds",
    ] {
        assert!(cr.get(f).is_some(), "CreateRound.{f}");
    }
}
