//! Whose secrets a policy may bind, through the routes as the daemon mounts
//! them (hatcheryd host_role.rs): `/v1/policies` checking names against
//! this crate's store, `/v1/secrets` beside it, one SQLite database, and
//! the caller's principal in the request as the tenants layer puts it.
//! Each key keeps secrets of its own: a policy binds only its owner's
//! (another owner's name is `unknown_secret`, as a name nobody stored),
//! and no key binds an E2B sandbox's `e2b.` header value.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use hatchery_policy::DbPolicyStore;
use hatchery_secrets::{SecretKey, Secrets};
use hatchery_tenants::Principal;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use std::sync::Arc;
use tower::ServiceExt;

struct Deployment {
    app: axum::Router,
    secrets: Secrets,
}

impl Deployment {
    async fn new() -> Deployment {
        let db = hatchery_db::Db::sqlite_memory().unwrap();
        let secrets = Secrets::open(db.clone(), SecretKey::from_bytes([7; 32]))
            .await
            .unwrap();
        let policies = Arc::new(DbPolicyStore::open(db).await.unwrap());
        let app =
            hatchery_policy::http::router_with_secrets(policies, Some(Arc::new(secrets.clone())))
                .merge(hatchery_secrets::http::router(secrets.clone()));
        Deployment { app, secrets }
    }

    async fn call(
        &self,
        who: Principal,
        method: &str,
        uri: &str,
        body: Value,
    ) -> (StatusCode, Value) {
        let mut req = Request::builder()
            .method(method)
            .uri(uri)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(&body).unwrap()))
            .unwrap();
        req.extensions_mut().insert(who);
        let resp = self.app.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }
}

fn tenant() -> Principal {
    Principal::Tenant("ten_a".into())
}

/// A policy whose one rule sends `secret` to a host its writer picks.
fn binding(secret: &str) -> Value {
    json!({"name": "exfil", "rules": [{"id": "steal", "effect": "allow",
        "match": {"tools": ["egress"], "hosts": ["attacker.example.net"], "ports": [443]},
        "credential": {"secret": secret,
                       "inject": {"header": {"name": "Authorization", "template": "Bearer {secret}"}}}}]})
}

fn plain() -> Value {
    json!({"name": "plain", "rules": [{"id": "out", "effect": "allow",
        "match": {"tools": ["egress"], "hosts": ["example.net"], "ports": [443]}}]})
}

fn code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("")
}

fn tenant_b() -> Principal {
    Principal::Tenant("ten_b".into())
}

#[tokio::test]
async fn a_key_keeps_its_own_secrets() {
    let d = Deployment::new().await;
    let secret = |name: &str| json!({"name": name, "value": "v-".to_string() + name});
    for who in [Principal::Operator, tenant(), tenant_b()] {
        let (s, info) = d
            .call(who.clone(), "POST", "/v1/secrets", secret("GH_TOKEN"))
            .await;
        assert_eq!(s, StatusCode::CREATED, "{who:?}: {info}");
        assert_eq!(info["tenant"], json!(who.tenant()), "{info}");
    }
    let (s, _) = d
        .call(tenant(), "POST", "/v1/secrets", secret("A_ONLY"))
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, e) = d
        .call(tenant(), "POST", "/v1/secrets", secret("GH_TOKEN"))
        .await;
    assert_eq!(
        (s, code(&e)),
        (StatusCode::CONFLICT, "secret_exists"),
        "{e}"
    );
    // The E2B adapter's names are reserved for every key.
    let (s, e) = d
        .call(
            tenant(),
            "POST",
            "/v1/secrets",
            secret("e2b.sbx_0123456789abcdef.0"),
        )
        .await;
    assert_eq!(
        (s, code(&e)),
        (StatusCode::BAD_REQUEST, "invalid_secret"),
        "{e}"
    );

    let listed = |v: &Value| -> Vec<(Value, String)> {
        v["secrets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| (x["tenant"].clone(), x["name"].as_str().unwrap().to_string()))
            .collect()
    };
    let (_, a) = d.call(tenant(), "GET", "/v1/secrets", Value::Null).await;
    assert_eq!(
        listed(&a),
        vec![
            (json!("ten_a"), "A_ONLY".into()),
            (json!("ten_a"), "GH_TOKEN".into())
        ]
    );
    let (_, b) = d.call(tenant_b(), "GET", "/v1/secrets", Value::Null).await;
    assert_eq!(listed(&b), vec![(json!("ten_b"), "GH_TOKEN".into())]);
    let (_, all) = d
        .call(Principal::Operator, "GET", "/v1/secrets", Value::Null)
        .await;
    assert_eq!(listed(&all).len(), 4, "{all}");

    // Another's name is not there for a key: 404 as for a missing one,
    // and the secret stays.
    let (s, e) = d
        .call(tenant_b(), "DELETE", "/v1/secrets/A_ONLY", Value::Null)
        .await;
    assert_eq!(
        (s, code(&e)),
        (StatusCode::NOT_FOUND, "secret_not_found"),
        "{e}"
    );
    let (s, _) = d
        .call(
            Principal::Operator,
            "DELETE",
            "/v1/secrets/A_ONLY",
            Value::Null,
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(
        &d.secrets.reveal(Some("ten_a"), "A_ONLY").await.unwrap()[..],
        b"v-A_ONLY"
    );
    // Deleting its own leaves the others' of the same name.
    let (s, _) = d
        .call(tenant_b(), "DELETE", "/v1/secrets/GH_TOKEN", Value::Null)
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    assert!(d.secrets.reveal(Some("ten_b"), "GH_TOKEN").await.is_err());
    assert_eq!(
        &d.secrets.reveal(Some("ten_a"), "GH_TOKEN").await.unwrap()[..],
        b"v-GH_TOKEN"
    );
    assert!(d.secrets.reveal(None, "GH_TOKEN").await.is_ok());
}

#[tokio::test]
async fn a_policy_binds_only_its_owners_secrets() {
    let d = Deployment::new().await;
    let store = |who: Principal, name: &'static str| {
        let d = &d;
        async move {
            let (s, _) = d
                .call(
                    who,
                    "POST",
                    "/v1/secrets",
                    json!({"name": name, "value": "v"}),
                )
                .await;
            assert_eq!(s, StatusCode::CREATED);
        }
    };
    store(Principal::Operator, "OPERATORS").await;
    store(tenant_b(), "B_ONLY").await;
    store(tenant(), "A_OWN").await;

    // The operator's secret, another tenant's, and a name nobody stored:
    // the same 400, so the refusal tells nothing of what others store.
    for name in ["OPERATORS", "B_ONLY", "NOT_STORED"] {
        let (s, e) = d
            .call(tenant(), "POST", "/v1/policies", binding(name))
            .await;
        assert_eq!(
            (s, code(&e)),
            (StatusCode::BAD_REQUEST, "unknown_secret"),
            "{name}: {e}"
        );
        let msg = e["error"]["message"].as_str().unwrap();
        assert!(msg.contains("tenant ten_a's secrets"), "{msg}");
    }
    // Its own: stored.
    let (s, p) = d
        .call(tenant(), "POST", "/v1/policies", binding("A_OWN"))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{p}");
    let versions = format!("/v1/policies/{}/versions", p["id"].as_str().unwrap());
    // A version of a tenant's policy binds the tenant's secrets, whoever
    // writes it: the operator's own secret is not one of them.
    for who in [tenant(), Principal::Operator] {
        let (s, e) = d
            .call(who.clone(), "POST", &versions, binding("OPERATORS"))
            .await;
        assert_eq!(
            (s, code(&e)),
            (StatusCode::BAD_REQUEST, "unknown_secret"),
            "{who:?}: {e}"
        );
    }
    let (s, v) = d
        .call(Principal::Operator, "POST", &versions, binding("A_OWN"))
        .await;
    assert_eq!(
        (s, v["version"].clone()),
        (StatusCode::CREATED, json!(2)),
        "{v}"
    );
    // Another tenant does not reach it at all.
    let (s, e) = d
        .call(tenant_b(), "POST", &versions, binding("B_ONLY"))
        .await;
    assert_eq!(
        (s, code(&e)),
        (StatusCode::NOT_FOUND, "policy_not_found"),
        "{e}"
    );

    // A built-in policy: its names checked in the caller's own, then
    // read-only.
    let (s, e) = d
        .call(
            tenant(),
            "POST",
            "/v1/policies/pol_standard/versions",
            binding("OPERATORS"),
        )
        .await;
    assert_eq!(
        (s, code(&e)),
        (StatusCode::BAD_REQUEST, "unknown_secret"),
        "{e}"
    );

    // The operator binds its own, not a tenant's.
    let (s, p) = d
        .call(
            Principal::Operator,
            "POST",
            "/v1/policies",
            binding("OPERATORS"),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{p}");
    let (s, e) = d
        .call(
            Principal::Operator,
            "POST",
            "/v1/policies",
            binding("A_OWN"),
        )
        .await;
    assert_eq!(
        (s, code(&e)),
        (StatusCode::BAD_REQUEST, "unknown_secret"),
        "{e}"
    );
}

#[tokio::test]
async fn no_key_binds_an_e2b_sandboxs_header_value() {
    let d = Deployment::new().await;
    // As the E2B adapter stores a sandbox's header value (`/v1/secrets`
    // refuses the name): it exists, so only the name's prefix refuses it.
    let sbx_value = "e2b.sbx_0123456789abcdef.0";
    d.secrets
        .create(None, sbx_value, "another sandbox's header")
        .await
        .unwrap();
    let (s, e) = d
        .call(
            Principal::Operator,
            "POST",
            "/v1/policies",
            binding(sbx_value),
        )
        .await;
    assert_eq!(
        (s, code(&e)),
        (StatusCode::BAD_REQUEST, "reserved_secret_name"),
        "{e}"
    );
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("E2B adapter"),
        "{e}"
    );

    let (s, p) = d
        .call(Principal::Operator, "POST", "/v1/policies", plain())
        .await;
    assert_eq!(s, StatusCode::CREATED, "{p}");
    let versions = format!("/v1/policies/{}/versions", p["id"].as_str().unwrap());
    let (s, e) = d
        .call(Principal::Operator, "POST", &versions, binding(sbx_value))
        .await;
    assert_eq!(
        (s, code(&e)),
        (StatusCode::BAD_REQUEST, "reserved_secret_name"),
        "{e}"
    );

    // A tenant: the same.
    let (s, e) = d
        .call(tenant(), "POST", "/v1/policies", binding(sbx_value))
        .await;
    assert_eq!(
        (s, code(&e)),
        (StatusCode::BAD_REQUEST, "reserved_secret_name"),
        "{e}"
    );
}
