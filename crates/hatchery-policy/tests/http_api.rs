//! The `/v1/policies` router against a real SQLite file: status codes, the
//! JSON error shape, validation messages that name the rule, and version
//! immutability as seen through the API.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use hatchery_policy::{http::router, DbPolicyStore};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use std::sync::Arc;
use tower::ServiceExt;

struct Api {
    app: axum::Router,
    dir: std::path::PathBuf,
}

impl Api {
    async fn new() -> Api {
        let dir = std::env::temp_dir().join(format!("hatchery-policy-http-{}", rand_u64()));
        std::fs::create_dir_all(&dir).unwrap();
        let db = hatchery_db::Db::sqlite(&dir.join("hatchery.db"))
            .await
            .unwrap();
        let store = DbPolicyStore::open(db).await.unwrap();
        Api {
            app: router(Arc::new(store)),
            dir,
        }
    }

    async fn call(&self, method: &str, uri: &str, body: Option<Vec<u8>>) -> (StatusCode, Value) {
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .header("content-type", "application/json")
            .body(body.map(Body::from).unwrap_or_else(Body::empty))
            .unwrap();
        let resp = self.app.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let v = serde_json::from_slice(&bytes).unwrap_or_else(|_| {
            panic!(
                "{method} {uri}: non-JSON body {:?}",
                String::from_utf8_lossy(&bytes)
            )
        });
        (status, v)
    }

    async fn post(&self, uri: &str, body: Value) -> (StatusCode, Value) {
        self.call("POST", uri, Some(serde_json::to_vec(&body).unwrap()))
            .await
    }
}

impl Drop for Api {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn rand_u64() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        ^ (std::process::id() as u64) << 32
}

fn error_code(v: &Value) -> &str {
    v["error"]["code"]
        .as_str()
        .unwrap_or_else(|| panic!("no error code in {v}"))
}

#[tokio::test]
async fn create_version_read() {
    let api = Api::new().await;
    let doc = json!({"name": "ci", "rules": [
        {"id": "push", "effect": "allow", "match": {"tools": ["git_push"]}}
    ]});
    let (s, p) = api.post("/v1/policies", doc.clone()).await;
    assert_eq!(s, StatusCode::CREATED, "{p}");
    assert_eq!(p["version"], 1);
    let id = p["id"].as_str().unwrap().to_string();
    assert_eq!(p["document"], doc);

    let doc2 = json!({"name": "ci", "rules": [
        {"id": "push", "effect": "deny", "match": {"tools": ["git_push"]}}
    ]});
    let (s, p2) = api
        .post(&format!("/v1/policies/{id}/versions"), doc2.clone())
        .await;
    assert_eq!(s, StatusCode::CREATED, "{p2}");
    assert_eq!(p2["version"], 2);

    let (s, latest) = api.call("GET", &format!("/v1/policies/{id}"), None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        (latest["version"].clone(), latest["document"].clone()),
        (json!(2), doc2)
    );
    let (s, v1) = api
        .call("GET", &format!("/v1/policies/{id}/versions/1"), None)
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v1["document"], doc, "version 1 is as written");

    let (s, list) = api.call("GET", "/v1/policies", None).await;
    assert_eq!(s, StatusCode::OK);
    let ids: Vec<&str> = list["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_str().unwrap())
        .collect();
    assert!(
        ids.contains(&"pol_standard") && ids.contains(&id.as_str()),
        "{list}"
    );
    let (s, std) = api.call("GET", "/v1/policies/pol_standard", None).await;
    assert_eq!((s, std["builtin"].clone()), (StatusCode::OK, json!(true)));
}

#[tokio::test]
async fn errors_are_json_and_name_the_rule() {
    let api = Api::new().await;
    let (s, e) = api
        .post("/v1/policies", json!({"name": "x", "rules": [
            {"id": "a", "effect": "allow"},
            {"id": "diff", "effect": "deny", "match": {"args": [{"field": "lines", "op": "gt", "value": "500"}]}}
        ]}))
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(error_code(&e), "invalid_policy");
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(msg.starts_with("rule 1 (id \"diff\"):"), "{msg}");

    let (s, e) = api
        .post(
            "/v1/policies",
            json!({"name": "x", "rules": [{"id": "a", "effect": "maybe"}]}),
        )
        .await;
    assert_eq!(
        (s, error_code(&e)),
        (StatusCode::BAD_REQUEST, "invalid_policy")
    );
    let (s, e) = api
        .call("POST", "/v1/policies", Some(b"{not json".to_vec()))
        .await;
    assert_eq!(
        (s, error_code(&e)),
        (StatusCode::BAD_REQUEST, "invalid_policy")
    );

    let big = vec![b' '; hatchery_policy::http::MAX_DOCUMENT_BYTES + 1];
    let (s, e) = api.call("POST", "/v1/policies", Some(big)).await;
    assert_eq!(
        (s, error_code(&e)),
        (StatusCode::PAYLOAD_TOO_LARGE, "too_large")
    );

    let (s, e) = api
        .call("GET", "/v1/policies/pol_0000000000000000", None)
        .await;
    assert_eq!(
        (s, error_code(&e)),
        (StatusCode::NOT_FOUND, "policy_not_found")
    );
    let (s, e) = api.call("GET", "/v1/policies/..%2Fetc", None).await;
    assert_eq!(
        (s, error_code(&e)),
        (StatusCode::NOT_FOUND, "policy_not_found")
    );
    let (s, e) = api
        .call("GET", "/v1/policies/pol_standard/versions/3", None)
        .await;
    assert_eq!(
        (s, error_code(&e)),
        (StatusCode::NOT_FOUND, "policy_version_not_found")
    );
    let (s, e) = api
        .call("GET", "/v1/policies/pol_standard/versions/0", None)
        .await;
    assert_eq!(
        (s, error_code(&e)),
        (StatusCode::BAD_REQUEST, "invalid_request")
    );
    let (s, e) = api
        .post(
            "/v1/policies/pol_standard/versions",
            json!({"name": "mine", "rules": []}),
        )
        .await;
    assert_eq!(
        (s, error_code(&e)),
        (StatusCode::CONFLICT, "policy_read_only")
    );
    let (s, e) = api
        .post(
            "/v1/policies/pol_0000000000000000/versions",
            json!({"name": "mine", "rules": []}),
        )
        .await;
    assert_eq!(
        (s, error_code(&e)),
        (StatusCode::NOT_FOUND, "policy_not_found")
    );
}
