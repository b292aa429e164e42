//! The `/v1/tenants` router on a real SQLite file, with a stand-in for
//! the daemon's auth (the principal comes from a test header): status
//! codes, the JSON error shape, caps at the edge, keys shown once and
//! never listed, operator only.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use hatchery_tenants::service::Usage;
use hatchery_tenants::{http::router, DbTenantStore, LiveUsage, Principal, Tenants, UsageError};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tower::ServiceExt;

struct Live(Arc<AtomicU64>);

#[async_trait::async_trait]
impl LiveUsage for Live {
    async fn usage(&self, _: &str) -> Result<Usage, UsageError> {
        Ok(Usage {
            live_sandboxes: self.0.load(Ordering::SeqCst),
            live_sessions: 0,
        })
    }
}

struct Api {
    app: axum::Router,
    live: Arc<AtomicU64>,
    _dir: tempfile::TempDir,
}

impl Api {
    async fn new() -> Api {
        let dir = tempfile::tempdir().unwrap();
        let db = hatchery_db::Db::sqlite(&dir.path().join("hatchery.db"))
            .await
            .unwrap();
        let store = DbTenantStore::open(db).await.unwrap();
        let live = Arc::new(AtomicU64::new(0));
        let tenants = Arc::new(Tenants::new(Arc::new(store), Arc::new(Live(live.clone()))));
        // The daemon's auth, in miniature: `x-test-principal` names the
        // caller; without it there is no principal.
        let app = router(tenants).layer(axum::middleware::from_fn(
            |mut req: axum::extract::Request, next: axum::middleware::Next| async move {
                let p = req
                    .headers()
                    .get("x-test-principal")
                    .map(|v| v.to_str().unwrap().to_string());
                match p.as_deref() {
                    Some("operator") => {
                        req.extensions_mut().insert(Principal::Operator);
                    }
                    Some(t) => {
                        req.extensions_mut().insert(Principal::Tenant(t.into()));
                    }
                    None => {}
                }
                next.run(req).await
            },
        ));
        Api {
            app,
            live,
            _dir: dir,
        }
    }

    async fn call_as(
        &self,
        who: Option<&str>,
        method: &str,
        uri: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut req = Request::builder()
            .method(method)
            .uri(uri)
            .header("content-type", "application/json");
        if let Some(w) = who {
            req = req.header("x-test-principal", w);
        }
        let body = body
            .map(|b| Body::from(serde_json::to_vec(&b).unwrap()))
            .unwrap_or_else(Body::empty);
        let resp = self
            .app
            .clone()
            .oneshot(req.body(body).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let v = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap()
        };
        (status, v)
    }

    async fn call(&self, method: &str, uri: &str, body: Option<Value>) -> (StatusCode, Value) {
        self.call_as(Some("operator"), method, uri, body).await
    }
}

fn code(v: &Value) -> &str {
    v["error"]["code"]
        .as_str()
        .unwrap_or_else(|| panic!("no error code in {v}"))
}

#[tokio::test]
async fn tenants_are_made_read_changed_and_deleted() {
    let api = Api::new().await;
    let (s, t) = api
        .call(
            "POST",
            "/v1/tenants",
            Some(json!({"name": "acme", "limits": {"live_sandboxes": 2}})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{t}");
    let id = t["id"].as_str().unwrap().to_string();
    assert_eq!(t["limits"]["live_sandboxes"], 2);
    assert_eq!(t["limits"]["tokens"], Value::Null);
    let (s, got) = api.call("GET", &format!("/v1/tenants/{id}"), None).await;
    assert_eq!((s, &got), (StatusCode::OK, &t));
    let (_, list) = api.call("GET", "/v1/tenants", None).await;
    assert_eq!(list["tenants"], json!([t]));
    let (s, p) = api
        .call(
            "PATCH",
            &format!("/v1/tenants/{id}"),
            Some(json!({"limits": {"tokens": 5000}})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{p}");
    assert_eq!(
        (
            p["name"].as_str(),
            &p["limits"]["tokens"],
            &p["limits"]["live_sandboxes"]
        ),
        (Some("acme"), &json!(5000), &Value::Null)
    );
    // Live sandboxes keep it.
    api.live.store(1, Ordering::SeqCst);
    let (s, e) = api.call("DELETE", &format!("/v1/tenants/{id}"), None).await;
    assert_eq!((s, code(&e)), (StatusCode::CONFLICT, "tenant_in_use"));
    api.live.store(0, Ordering::SeqCst);
    let (s, _) = api.call("DELETE", &format!("/v1/tenants/{id}"), None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    for (m, u) in [
        ("GET", format!("/v1/tenants/{id}")),
        ("DELETE", format!("/v1/tenants/{id}")),
        ("GET", "/v1/tenants/ten_nope".into()),
        ("POST", format!("/v1/tenants/{id}/keys")),
    ] {
        let (s, e) = api.call(m, &u, None).await;
        assert_eq!(
            (s, code(&e)),
            (StatusCode::NOT_FOUND, "tenant_not_found"),
            "{m} {u}"
        );
    }
}

#[tokio::test]
async fn bad_input_is_refused_at_the_edge_and_leaves_nothing() {
    let api = Api::new().await;
    let long = "x".repeat(hatchery_tenants::model::MAX_NAME_CHARS + 1);
    for body in [
        json!({"name": ""}),
        json!({"name": long}),
        json!({"name": "a", "limits": {"live_sandboxes": 100_001}}),
        json!({"name": "a", "limits": {"tokens": -1}}),
        json!({"name": "a", "limits": {"sandboxes": 1}}),
        json!({"name": "a", "owner": "b"}),
        json!({"limits": {}}),
    ] {
        let (s, e) = api.call("POST", "/v1/tenants", Some(body.clone())).await;
        assert_eq!(
            (s, code(&e)),
            (StatusCode::BAD_REQUEST, "invalid_request"),
            "{body}"
        );
    }
    let (s, e) = api
        .call(
            "POST",
            "/v1/tenants",
            Some(json!({"name": "x".repeat(20_000)})),
        )
        .await;
    assert_eq!((s, code(&e)), (StatusCode::PAYLOAD_TOO_LARGE, "too_large"));
    let (_, list) = api.call("GET", "/v1/tenants", None).await;
    assert_eq!(list["tenants"], json!([]));
}

#[tokio::test]
async fn keys_are_shown_once_listed_without_secrets_and_capped() {
    let api = Api::new().await;
    let (_, t) = api
        .call("POST", "/v1/tenants", Some(json!({"name": "k"})))
        .await;
    let id = t["id"].as_str().unwrap();
    let (s, k) = api
        .call("POST", &format!("/v1/tenants/{id}/keys"), None)
        .await;
    assert_eq!(s, StatusCode::CREATED, "{k}");
    let secret = k["key"].as_str().unwrap();
    assert!(secret.starts_with("htk_") && secret.starts_with(k["prefix"].as_str().unwrap()));
    let (_, list) = api
        .call("GET", &format!("/v1/tenants/{id}/keys"), None)
        .await;
    let listed = serde_json::to_string(&list).unwrap();
    assert!(
        !listed.contains(&secret[12..]),
        "a listing holds no secret: {listed}"
    );
    assert_eq!(list["keys"][0]["id"], k["id"]);
    assert!(list["keys"][0].get("key").is_none());
    for _ in 1..hatchery_tenants::model::MAX_ACTIVE_KEYS {
        let (s, _) = api
            .call("POST", &format!("/v1/tenants/{id}/keys"), None)
            .await;
        assert_eq!(s, StatusCode::CREATED);
    }
    let (s, e) = api
        .call("POST", &format!("/v1/tenants/{id}/keys"), None)
        .await;
    assert_eq!((s, code(&e)), (StatusCode::CONFLICT, "too_many_keys"));
    let key_id = k["id"].as_str().unwrap();
    let (s, r) = api
        .call("DELETE", &format!("/v1/tenants/{id}/keys/{key_id}"), None)
        .await;
    assert_eq!(s, StatusCode::OK, "{r}");
    assert!(r["revoked_at"].is_string());
    let (s, e) = api
        .call(
            "DELETE",
            &format!("/v1/tenants/{id}/keys/key_0000000000000000"),
            None,
        )
        .await;
    assert_eq!((s, code(&e)), (StatusCode::NOT_FOUND, "key_not_found"));
    let (s, _) = api
        .call("POST", &format!("/v1/tenants/{id}/keys"), None)
        .await;
    assert_eq!(s, StatusCode::CREATED, "a revoke makes room");
}

#[tokio::test]
async fn only_the_operator_manages_tenants() {
    let api = Api::new().await;
    let (_, t) = api
        .call("POST", "/v1/tenants", Some(json!({"name": "a"})))
        .await;
    let id = t["id"].as_str().unwrap().to_string();
    let routes = [
        (
            "POST",
            "/v1/tenants".to_string(),
            Some(json!({"name": "b"})),
        ),
        ("GET", "/v1/tenants".into(), None),
        ("GET", format!("/v1/tenants/{id}"), None),
        (
            "PATCH",
            format!("/v1/tenants/{id}"),
            Some(json!({"name": "c"})),
        ),
        ("DELETE", format!("/v1/tenants/{id}"), None),
        ("POST", format!("/v1/tenants/{id}/keys"), None),
        ("GET", format!("/v1/tenants/{id}/keys"), None),
        (
            "DELETE",
            format!("/v1/tenants/{id}/keys/key_0000000000000000"),
            None,
        ),
    ];
    for who in [Some(id.as_str()), None] {
        for (m, u, b) in &routes {
            let (s, e) = api.call_as(who, m, u, b.clone()).await;
            assert_eq!(
                (s, code(&e)),
                (StatusCode::FORBIDDEN, "forbidden"),
                "{who:?} {m} {u}"
            );
        }
    }
    let (_, got) = api.call("GET", &format!("/v1/tenants/{id}"), None).await;
    assert_eq!(got, t, "nothing changed");
}
