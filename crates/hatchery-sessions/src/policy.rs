//! Which `policy_id`s exist. The policy service (another crate) plugs in
//! through [`PolicyCatalog`]; until then [`BuiltinPolicies`] knows only
//! `pol_standard`.

/// A policy pinned by a session: its id and the version in force when
/// the session was created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyRef {
    pub id: String,
    pub version: u32,
    /// The tenant whose policy it is (`None`: the operator's or built in).
    pub tenant: Option<String>,
    pub builtin: bool,
}

impl PolicyRef {
    /// Whether a session of `tenant` (`None`: the operator's) may pin it:
    /// a tenant pins the built-in policies and its own only.
    pub fn usable_by(&self, tenant: Option<&str>) -> bool {
        match tenant {
            None => true,
            Some(t) => self.builtin || self.tenant.as_deref() == Some(t),
        }
    }
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
            tenant: None,
            builtin: true,
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
        let std = BuiltinPolicies.resolve("pol_standard").await.unwrap();
        assert!(std.usable_by(None) && std.usable_by(Some("ten_a")));
    }

    #[test]
    fn a_tenant_pins_its_own_and_the_built_in_policies_only() {
        let p = |tenant: Option<&str>| PolicyRef {
            id: "pol_x".into(),
            version: 1,
            tenant: tenant.map(str::to_string),
            builtin: false,
        };
        assert!(p(Some("ten_a")).usable_by(Some("ten_a")));
        assert!(!p(Some("ten_a")).usable_by(Some("ten_b")));
        assert!(
            !p(None).usable_by(Some("ten_b")),
            "the operator's policies are not a tenant's"
        );
        assert!(p(Some("ten_a")).usable_by(None) && p(None).usable_by(None));
    }
}
