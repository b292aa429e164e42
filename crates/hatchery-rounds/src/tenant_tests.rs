//! A tenant's round makes its sandboxes as the tenant's (issue 36 audit):
//! every one records `metadata.tenant`, which is what the sandbox API
//! counts and admits against the tenant's `live_sandboxes` limit (the
//! rounds create with the API key; the admission itself is hatchery-api's,
//! tested end to end in tests/integration/test_tenants.py). The
//! operator's rounds record none.

use crate::grading_tests::Env;
use hatchery_tenants::metadata::TENANT_KEY;

const KINDS: [&str; 3] = ["round-prepare", "round-session", "round-grader"];

async fn made_by(tenant: Option<&str>) -> Env {
    let env = Env::new().await;
    let (_, s, _) = env.session_of(tenant).await;
    env.submit(&s).await.unwrap();
    env.graded(&s).await;
    env
}

#[tokio::test]
async fn a_tenant_s_round_sandboxes_record_the_tenant() {
    let env = made_by(Some("ten_a")).await;
    for kind in KINDS {
        let made = env.fake.made(kind);
        assert!(!made.is_empty(), "no {kind} sandbox was made");
        for s in made {
            assert_eq!(
                s.metadata.get(TENANT_KEY).map(String::as_str),
                Some("ten_a"),
                "{kind} {}: {:?}",
                s.id,
                s.metadata
            );
        }
    }
}

#[tokio::test]
async fn the_operator_s_round_sandboxes_record_no_tenant() {
    let env = made_by(None).await;
    for kind in KINDS {
        for s in env.fake.made(kind) {
            assert!(
                !s.metadata.contains_key(TENANT_KEY),
                "{kind}: {:?}",
                s.metadata
            );
        }
    }
}
