//! Who may bind which secrets in a policy document of the store: checked
//! when one is written through `/v1/policies` (http.rs) and again when a
//! stored version is compiled for use (cache.rs), so a version written
//! before these checks existed binds nothing it should not.
//!
//! - Whose secrets a rule names is not a question for the document: a
//!   policy's names are looked up among its owner's secrets when it is
//!   written (http.rs, `unknown_secret` for a name its owner has not
//!   stored, another owner's included), and the egress proxy reads a value
//!   only in the session's tenant (hatchery-secrets), so a tenant's rule
//!   never sends the operator's or another tenant's secret anywhere.
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

/// Checks `doc`, whoever wrote it: the first offending rule is named.
pub fn check(doc: &PolicyDocument) -> Result<(), ScopeError> {
    for (index, rule) in doc.rules.iter().enumerate() {
        let Some(c) = &rule.credential else { continue };
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
    fn a_plain_name_is_anyones_to_bind() {
        assert_eq!(check(&doc(None)), Ok(()));
        assert_eq!(check(&doc(Some("GH_TOKEN"))), Ok(()));
    }

    #[test]
    fn no_document_binds_an_e2b_sandboxs_value() {
        assert!(matches!(
            check(&doc(Some("e2b.sbx_0123456789abcdef.0"))),
            Err(ScopeError::AdapterSecret { index: 1, .. })
        ));
        // Only the prefix is reserved.
        assert_eq!(check(&doc(Some("e2b_token"))), Ok(()));
    }
}
