//! Which `policy_id`s exist. The policy service (another crate) plugs in
//! through [`PolicyCatalog`]; until then [`BuiltinPolicies`] knows only
//! `pol_standard`.

/// A policy pinned by a session: its id and the version in force when
/// the session was created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyRef {
    pub id: String,
    pub version: u32,
}

#[async_trait::async_trait]
pub trait PolicyCatalog: Send + Sync + 'static {
    /// The current version of `id`, or `None` if there is no such policy.
    async fn resolve(&self, id: &str) -> Option<PolicyRef>;
}

pub const DEFAULT_POLICY: &str = "pol_standard";

pub struct BuiltinPolicies;

#[async_trait::async_trait]
impl PolicyCatalog for BuiltinPolicies {
    async fn resolve(&self, id: &str) -> Option<PolicyRef> {
        (id == DEFAULT_POLICY).then(|| PolicyRef {
            id: id.to_string(),
            version: 1,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn builtin() {
        assert_eq!(
            BuiltinPolicies
                .resolve("pol_standard")
                .await
                .unwrap()
                .version,
            1
        );
        assert!(BuiltinPolicies.resolve("pol_other").await.is_none());
    }
}
