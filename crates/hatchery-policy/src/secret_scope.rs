//! Who may bind which secrets in a policy document of the store: checked
//! when one is written through `/v1/policies` (http.rs) and again when a
//! stored version is compiled for use (cache.rs), so a version written
//! before these checks existed binds nothing it should not.
//!
//! - Secrets are the operator's (`/v1/secrets` takes only the operator
//!   key), so only the operator binds them. A tenant's credential rule
//!   could name the operator's secret with a host of the tenant's choosing,
//!   and the tenant's own session's egress proxy would send it there.
//! - No stored document names an [`ADAPTER_PREFIX`] secret: those are the
//!   E2B adapter's per-sandbox header values, which the adapter binds in a
//!   policy it compiles itself (hatchery-e2b-backend `headers::policy`),
//!   never one of the store. A stored rule naming one would hand one
//!   sandbox's value to whichever session pins it.

use crate::document::PolicyDocument;

/// The names the E2B adapter stores its sandboxes' header values under
/// (`e2b.<sandbox>.<n>`); `/v1/secrets` refuses them too.
pub const ADAPTER_PREFIX: &str = "e2b.";

/// Why a document may not bind a secret it names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScopeError {
    /// A tenant's document with a credential rule. The secret's name is
    /// not repeated: whether it exists is none of the tenant's business.
    #[error(
        "rule {index} (id {id:?}) binds a secret: credential rules are written with the operator key \
         only (secrets are the operator's, and a tenant's rule could send one to a host of its choosing)"
    )]
    TenantCredential { index: usize, id: String },
    #[error(
        "rule {index} (id {id:?}) binds secret {secret:?}: names starting with \"{ADAPTER_PREFIX}\" are \
         E2B sandboxes' own header values, which only the E2B adapter binds"
    )]
    AdapterSecret {
        index: usize,
        id: String,
        secret: String,
    },
}

/// Checks `doc`, written (or stored) by `tenant` (`None`: the operator).
/// The first offending rule is named.
pub fn check(doc: &PolicyDocument, tenant: Option<&str>) -> Result<(), ScopeError> {
    for (index, rule) in doc.rules.iter().enumerate() {
        let Some(c) = &rule.credential else { continue };
        if tenant.is_some() {
            return Err(ScopeError::TenantCredential {
                index,
                id: rule.id.clone(),
            });
        }
        if c.secret.starts_with(ADAPTER_PREFIX) {
            return Err(ScopeError::AdapterSecret {
                index,
                id: rule.id.clone(),
                secret: c.secret.clone(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn doc(secret: Option<&str>) -> PolicyDocument {
        let mut rules =
            vec![json!({"id": "plain", "effect": "allow", "match": {"tools": ["egress"]}})];
        if let Some(s) = secret {
            rules.push(json!({"id": "cred", "effect": "allow",
                "match": {"tools": ["egress"], "hosts": ["api.example.com"], "ports": [443]},
                "credential": {"secret": s, "inject": {"header": {"name": "Authorization", "template": "Bearer {secret}"}}}}));
        }
        serde_json::from_value(json!({"name": "p", "rules": rules})).unwrap()
    }

    #[test]
    fn a_tenant_binds_no_secret() {
        assert_eq!(check(&doc(None), Some("ten_a")), Ok(()));
        let e = check(&doc(Some("GH_TOKEN")), Some("ten_a")).unwrap_err();
        assert_eq!(
            e,
            ScopeError::TenantCredential {
                index: 1,
                id: "cred".into()
            }
        );
        assert!(!e.to_string().contains("GH_TOKEN"), "{e}");
        assert_eq!(check(&doc(Some("GH_TOKEN")), None), Ok(()));
    }

    #[test]
    fn no_document_binds_an_e2b_sandboxs_value() {
        for tenant in [None, Some("ten_a")] {
            assert!(check(&doc(Some("e2b.sbx_0123456789abcdef.0")), tenant).is_err());
        }
        assert!(matches!(
            check(&doc(Some("e2b.sbx_0123456789abcdef.0")), None),
            Err(ScopeError::AdapterSecret { index: 1, .. })
        ));
        // Only the prefix is reserved.
        assert_eq!(check(&doc(Some("e2b_token")), None), Ok(()));
    }
}
