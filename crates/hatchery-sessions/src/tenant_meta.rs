//! A tenant's session's metadata: what makes it, and its sandboxes, the
//! tenant's (issue 36 audit).

use std::collections::BTreeMap;

/// A tenant's session says it is the tenant's in `metadata.tenant` too
/// (copied to its sandboxes, where it is what makes them the tenant's),
/// whatever the body said: a tenant key cannot plant a session, or its
/// sandbox, in another tenant's account (issue 36 audit). The operator's
/// metadata is left as given (`metadata.tenant` by hand is the
/// operator's to set, as on sandboxes).
pub(crate) fn stamp(metadata: &mut BTreeMap<String, String>, tenant: Option<&str>) {
    if let Some(t) = tenant {
        metadata.insert(TENANT_KEY.to_string(), t.to_string());
    }
}

/// The metadata key that names a sandbox's tenant (hatchery-api's
/// `scope::TENANT_KEY`, which the sandbox list and the tenant's
/// live-sandbox count filter on).
pub const TENANT_KEY: &str = "tenant";
