//! The egress interception CA inside a session's sandbox: appended to the
//! system bundle, and named by the variables clients read instead of it.

use super::{fail, AGENT_DIR, R};
use crate::session_core::SessionCore;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The CA alone (for NODE_EXTRA_CA_CERTS, which adds to Node's own store).
const GUEST_CA_FILE: &str = "/usr/local/share/ca-certificates/hatchery-egress.crt";
/// The system bundle with the CA appended: what every other client reads.
const GUEST_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
const GUEST_CA_ENV: [(&str, &str); 6] = [
    ("SSL_CERT_FILE", GUEST_BUNDLE),
    ("REQUESTS_CA_BUNDLE", GUEST_BUNDLE),
    ("PIP_CERT", GUEST_BUNDLE),
    ("GIT_SSL_CAINFO", GUEST_BUNDLE),
    ("CURL_CA_BUNDLE", GUEST_BUNDLE),
    ("NODE_EXTRA_CA_CERTS", GUEST_CA_FILE),
];

/// Sets the trust variables, unless the session sets any of them itself:
/// then it names its own trust and none is added. Setting only the others
/// would override its choice, because clients read several of them:
/// pip, given PIP_CERT, still verifies against REQUESTS_CA_BUNDLE when
/// that is set (requests' environment wins over the session's `verify`).
pub(super) fn add_trust_env(env: &mut BTreeMap<String, String>) {
    if GUEST_CA_ENV.iter().any(|(k, _)| env.contains_key(*k)) {
        return;
    }
    for (k, v) in GUEST_CA_ENV {
        env.insert(k.to_string(), v.to_string());
    }
}

/// Appends the CA to the sandbox's system bundle.
pub(super) async fn install(svc: &Arc<SessionCore>, sbx: &str, pem: String) -> R<()> {
    let staged = format!("{AGENT_DIR}/egress-ca.pem");
    svc.sandboxes
        .write_file(sbx, &staged, pem.into_bytes())
        .await?;
    let script = format!(
        "set -e; mkdir -p /usr/local/share/ca-certificates /etc/ssl/certs; \
         cp {staged} {GUEST_CA_FILE}; cat {GUEST_CA_FILE} >> {GUEST_BUNDLE}"
    );
    let x = svc
        .sandboxes
        .exec(sbx, vec!["/bin/sh".into(), "-c".into(), script], "/", 60)
        .await?;
    if x.exit_code != 0 {
        return Err(fail(
            "services_unavailable",
            format!("installing the egress CA in the sandbox: {}", x.stderr),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_without_trust_settings_gets_them_all() {
        let mut env = BTreeMap::from([("FOO".to_string(), "1".to_string())]);
        add_trust_env(&mut env);
        assert_eq!(env["PIP_CERT"], GUEST_BUNDLE);
        assert_eq!(env["REQUESTS_CA_BUNDLE"], GUEST_BUNDLE);
        assert_eq!(env["NODE_EXTRA_CA_CERTS"], GUEST_CA_FILE);
        assert_eq!(env.len(), 7);
    }

    #[test]
    fn a_session_that_names_its_own_trust_keeps_it_alone() {
        let mut env = BTreeMap::from([("PIP_CERT".to_string(), "/w/ca.pem".to_string())]);
        add_trust_env(&mut env);
        assert_eq!(env.len(), 1, "{env:?}");
        assert_eq!(env["PIP_CERT"], "/w/ca.pem");
    }
}
