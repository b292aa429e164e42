//! A session's sandbox is its tenant's (issue 36 audit): the session
//! records the caller's tenant (from its key) in `metadata.tenant` too,
//! whatever the body said, and its sandboxes record the session's
//! recorded tenant, so a tenant cannot plant a sandbox in another's
//! account (where it would be listed, counted, exec'able and block the
//! tenant's delete). The operator's metadata is kept as given.

use super::{ids, Env};
use crate::models::CreateSessionBody;
use crate::runner::sandbox_metadata;
use crate::state::SessionState as S;
use crate::store::TenantLimits;

impl Env {
    async fn create_as(&self, tenant: Option<&str>, named: &str) -> String {
        let body: CreateSessionBody = serde_json::from_value(serde_json::json!({
            "repo": self.repo, "task": "fix the bug",
            "metadata": {"tenant": named, "team": "blue"}
        }))
        .unwrap();
        let limits = TenantLimits::default();
        let t = tenant.map(|t| (t, &limits));
        self.svc.create(body, t).await.unwrap().0.session_id
    }
}

#[tokio::test]
async fn a_tenant_s_session_and_its_sandbox_record_the_caller_not_the_body() {
    let e = Env::new(|_| {});
    let id = e.create_as(Some("ten_me"), "ten_victim").await;
    let s = e.state(&id, S::Running).await;
    assert_eq!(s.spec.tenant.as_deref(), Some("ten_me"));
    assert_eq!(s.spec.metadata["tenant"], "ten_me", "stamped at create");
    assert_eq!(s.spec.metadata["team"], "blue", "the rest kept");
    let (sbx, _) = ids(&s);
    let sb = e.fake.sandbox(&sbx).unwrap();
    assert_eq!(sb.metadata["tenant"], "ten_me", "{:?}", sb.metadata);
    assert_eq!(sb.metadata["hatchery_session"], id);
}

#[tokio::test]
async fn a_stored_session_naming_another_tenant_still_gets_its_own_sandbox() {
    let e = Env::new(|_| {});
    let id = e.create_as(Some("ten_me"), "ten_victim").await;
    // As a session created before the stamp was stored it.
    let mut s = e.get(&id).await;
    s.spec.metadata.insert("tenant".into(), "ten_victim".into());
    assert_eq!(sandbox_metadata(&s)["tenant"], "ten_me");
    // The operator's session: `metadata.tenant` is the operator's to set.
    s.spec.tenant = None;
    assert_eq!(sandbox_metadata(&s)["tenant"], "ten_victim");
}

#[tokio::test]
async fn the_operator_s_session_keeps_the_metadata_it_was_given() {
    let e = Env::new(|_| {});
    let id = e.create_as(None, "acme").await;
    let s = e.state(&id, S::Running).await;
    assert_eq!(s.spec.tenant, None);
    let (sbx, _) = ids(&s);
    assert_eq!(e.fake.sandbox(&sbx).unwrap().metadata["tenant"], "acme");
}
