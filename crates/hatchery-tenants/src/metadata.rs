//! What makes a sandbox (or a session) a tenant's: `metadata.tenant`.
//! The sandbox API's list and a tenant's `live_sandboxes` count filter on
//! it (hatchery-api `scope::TENANT_KEY`), and admits a create naming it
//! against that tenant's limit; the products that make sandboxes for a
//! tenant (sessions, rounds) stamp it here, so they cannot disagree.

use std::collections::BTreeMap;

/// The metadata key that names a sandbox's tenant.
pub const TENANT_KEY: &str = "tenant";

/// Sets `metadata.tenant` to `tenant`, whatever it said before (a tenant
/// key cannot plant a session or sandbox in another tenant's account,
/// issue 36 audit); `None` (the operator's) leaves it as given.
pub fn stamp(metadata: &mut BTreeMap<String, String>, tenant: Option<&str>) {
    if let Some(t) = tenant {
        metadata.insert(TENANT_KEY.to_string(), t.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_overrides_and_the_operator_leaves_as_given() {
        let mut m = BTreeMap::from([(TENANT_KEY.to_string(), "ten_b".to_string())]);
        stamp(&mut m, None);
        assert_eq!(m[TENANT_KEY], "ten_b");
        stamp(&mut m, Some("ten_a"));
        assert_eq!(m[TENANT_KEY], "ten_a");
    }
}
