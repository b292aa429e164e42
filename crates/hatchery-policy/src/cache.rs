//! Compiled policies by (id, version). Versions never change, so an entry
//! never goes stale; the cache only bounds how many it holds. This is what
//! a broker or the egress proxy asks on every call for a session's pinned
//! version: a map lookup after the first time.

use crate::compile::Policy;
use crate::store::{PolicyStore, StoreError};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Entries kept before the cache starts over.
pub const MAX_CACHED: usize = 4096;

pub struct CompiledPolicies {
    store: Arc<dyn PolicyStore>,
    map: Mutex<HashMap<(String, u32), Arc<Policy>>>,
}

impl CompiledPolicies {
    pub fn new(store: Arc<dyn PolicyStore>) -> Self {
        CompiledPolicies {
            store,
            map: Mutex::new(HashMap::new()),
        }
    }

    /// The compiled `(id, version)`; read from the store the first time.
    pub async fn get(&self, id: &str, version: u32) -> Result<Arc<Policy>, StoreError> {
        let key = (id.to_string(), version);
        if let Some(p) = self.lock().get(&key) {
            return Ok(p.clone());
        }
        let stored = self.store.version(id, version).await?;
        // A version written before `/v1/policies` checked which secrets
        // it binds (secret_scope.rs) is not used: a rule naming an E2B
        // sandbox's header value would send it where the rule says. (A
        // tenant's rule is used: the proxy reads its secrets in the
        // session's tenant, hatchery-secrets.)
        crate::secret_scope::check(&stored.document).map_err(|source| StoreError::OutOfScope {
            id: id.to_string(),
            version,
            source,
        })?;
        // Stored documents were valid when written; compiling again guards
        // against a store edited behind our back.
        let p = Arc::new(Policy::compile(&stored.document)?);
        let mut m = self.lock();
        if m.len() >= MAX_CACHED {
            m.clear();
        }
        Ok(m.entry(key).or_insert(p).clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, u32), Arc<Policy>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DbPolicyStore, Effect, Request};
    use serde_json::{json, Value};

    #[tokio::test]
    async fn pinned_versions_keep_their_rules() {
        let store = Arc::new(DbPolicyStore::scratch().await.unwrap());
        let doc = |effect: &str| {
            serde_json::from_value(json!({"name": "p", "rules": [{"id": "r", "effect": effect}]}))
                .unwrap()
        };
        let p = store.create(doc("allow"), None).await.unwrap();
        let cache = CompiledPolicies::new(store.clone());
        let v1 = cache.get(&p.id, 1).await.unwrap();
        store.add_version(&p.id, doc("deny")).await.unwrap();
        let req = Request {
            tool: "t",
            args: &Value::Null,
            cost_cents: None,
            dest: None,
            ctx: None,
        };
        // A session pinned to version 1 is unaffected by version 2.
        assert_eq!(
            cache.get(&p.id, 1).await.unwrap().evaluate(&req).effect,
            Effect::Allow
        );
        assert!(
            Arc::ptr_eq(&v1, &cache.get(&p.id, 1).await.unwrap()),
            "second read is cached"
        );
        assert_eq!(
            cache.get(&p.id, 2).await.unwrap().evaluate(&req).effect,
            Effect::Deny
        );
        assert!(matches!(
            cache.get(&p.id, 3).await,
            Err(StoreError::VersionNotFound(..))
        ));
        assert!(matches!(
            cache.get("pol_nope", 1).await,
            Err(StoreError::NotFound(_))
        ));
    }

    #[tokio::test]
    async fn a_stored_version_that_binds_what_its_owner_may_not_is_not_used() {
        let store = Arc::new(DbPolicyStore::scratch().await.unwrap());
        let doc = |secret: &str| -> crate::PolicyDocument {
            serde_json::from_value(json!({"name": "p", "rules": [{"id": "cred", "effect": "allow",
                "match": {"tools": ["egress"], "hosts": ["api.example.com"], "ports": [443]},
                "credential": {"secret": secret, "inject": {"header": {"name": "Authorization", "template": "Bearer {secret}"}}}}]}))
            .unwrap()
        };
        // Written straight to the store, as before the API checked them.
        let adapters = store
            .create(doc("e2b.sbx_0123456789abcdef.0"), None)
            .await
            .unwrap();
        let operators = store.create(doc("GH_TOKEN"), None).await.unwrap();
        let tenants = store.create(doc("GH_TOKEN"), Some("ten_a")).await.unwrap();
        let cache = CompiledPolicies::new(store.clone());
        assert!(matches!(
            cache.get(&adapters.id, 1).await,
            Err(StoreError::OutOfScope { .. })
        ));
        // An operator's and a tenant's own binding are used (each reads
        // its secrets in the session's tenant at the proxy).
        for p in [&operators, &tenants] {
            assert_eq!(
                cache.get(&p.id, 1).await.unwrap().credentials().count(),
                1,
                "{}",
                p.id
            );
        }
    }
}
