//! Whose secrets a policy may bind, through the routes as the daemon mounts
//! them (hatcheryd host_role.rs): `/v1/policies` checking names against
//! this crate's store, `/v1/secrets` beside it, one SQLite database, and
//! the caller's principal in the request as the tenants layer puts it.
//! A tenant's key writes no credential rule (the secrets are the
//! operator's), and no key binds an E2B sandbox's `e2b.` header value.

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

#[tokio::test]
async fn a_tenant_key_binds_no_secret() {
    let d = Deployment::new().await;
    let (s, _) = d
        .call(
            Principal::Operator,
            "POST",
            "/v1/secrets",
            json!({"name": "GH_TOKEN", "value": "ghp_x"}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);

    // The operator's secret, and a name that is not stored: the same 403
    // (not unknown_secret), so the refusal tells nothing of what is stored.
    for name in ["GH_TOKEN", "NOT_STORED"] {
        let (s, e) = d
            .call(tenant(), "POST", "/v1/policies", binding(name))
            .await;
        assert_eq!(
            (s, code(&e)),
            (StatusCode::FORBIDDEN, "credential_rules_operator_only"),
            "{name}: {e}"
        );
        let msg = e["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("rule 0 (id \"steal\")") && msg.contains("operator key"),
            "{msg}"
        );
        assert!(!msg.contains(name), "{msg}");
    }

    // Its own policy: a version with a credential rule is refused too, by
    // the tenant and by the operator (a tenant's policy binds nothing),
    // and the policy stays at version 1.
    let (s, p) = d.call(tenant(), "POST", "/v1/policies", plain()).await;
    assert_eq!(s, StatusCode::CREATED, "{p}");
    let versions = format!("/v1/policies/{}/versions", p["id"].as_str().unwrap());
    for who in [tenant(), Principal::Operator] {
        let (s, e) = d
            .call(who.clone(), "POST", &versions, binding("GH_TOKEN"))
            .await;
        assert_eq!(
            (s, code(&e)),
            (StatusCode::FORBIDDEN, "credential_rules_operator_only"),
            "{who:?}: {e}"
        );
    }
    let (s, v) = d.call(tenant(), "POST", &versions, plain()).await;
    assert_eq!(
        (s, v["version"].clone()),
        (StatusCode::CREATED, json!(2)),
        "{v}"
    );

    // A built-in policy: refused for the binding before the store says
    // read-only (and before the secrets are looked up).
    let (s, e) = d
        .call(
            tenant(),
            "POST",
            "/v1/policies/pol_standard/versions",
            binding("NOT_STORED"),
        )
        .await;
    assert_eq!(
        (s, code(&e)),
        (StatusCode::FORBIDDEN, "credential_rules_operator_only"),
        "{e}"
    );

    // Nothing of the tenant's binds a secret.
    let (s, list) = d.call(tenant(), "GET", "/v1/policies", Value::Null).await;
    assert_eq!(s, StatusCode::OK);
    let names: Vec<&str> = list["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert!(!names.contains(&"exfil"), "{list}");

    // The operator binds its own secret.
    let (s, p) = d
        .call(
            Principal::Operator,
            "POST",
            "/v1/policies",
            binding("GH_TOKEN"),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{p}");
}

#[tokio::test]
async fn no_key_binds_an_e2b_sandboxs_header_value() {
    let d = Deployment::new().await;
    // As the E2B adapter stores a sandbox's header value (`/v1/secrets`
    // refuses the name): it exists, so only the name's prefix refuses it.
    let sbx_value = "e2b.sbx_0123456789abcdef.0";
    d.secrets
        .create(sbx_value, "another sandbox's header")
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

    // A tenant: refused for binding anything at all.
    let (s, e) = d
        .call(tenant(), "POST", "/v1/policies", binding(sbx_value))
        .await;
    assert_eq!(
        (s, code(&e)),
        (StatusCode::FORBIDDEN, "credential_rules_operator_only"),
        "{e}"
    );
}
