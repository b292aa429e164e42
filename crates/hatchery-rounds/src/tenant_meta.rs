//! What makes a round's sandbox its tenant's (issue 36 audit).

use std::collections::BTreeMap;

/// `m` for a sandbox of a round made by `tenant` (`None`: the operator's
/// round, no tenant). Rounds create sandboxes with the API key, which
/// the API admits against the tenant `metadata.tenant` names, so a
/// tenant's round sandboxes are counted and limited as its own creates
/// are (issue 36 audit: they recorded no tenant and passed no limit).
pub(crate) fn of_tenant(
    mut m: BTreeMap<String, String>,
    tenant: Option<&str>,
) -> BTreeMap<String, String> {
    hatchery_tenants::metadata::stamp(&mut m, tenant);
    m
}
