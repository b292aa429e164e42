//! Where a sandbox that uses the egress proxy's interception keeps the
//! proxy's CA, and the variables that point clients at it: shared by
//! session sandboxes (the runner) and E2B sandboxes with header
//! transforms (hatchery-agents), so both trust it the same way.

use std::collections::BTreeMap;

/// The CA alone (for NODE_EXTRA_CA_CERTS, which adds to Node's own store).
pub const GUEST_CA_FILE: &str = "/usr/local/share/ca-certificates/hatchery-egress.crt";
/// The system bundle with the CA appended: what every other client reads.
pub const GUEST_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// The variables clients read for their trust, and what each is set to.
pub const GUEST_CA_ENV: [(&str, &str); 6] = [
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
pub fn add_trust_env(env: &mut BTreeMap<String, String>) {
    if GUEST_CA_ENV.iter().any(|(k, _)| env.contains_key(*k)) {
        return;
    }
    for (k, v) in GUEST_CA_ENV {
        env.insert(k.to_string(), v.to_string());
    }
}

/// The shell script (run as root in the sandbox) that installs the CA
/// written at `staged` and appends it to the system bundle.
pub fn install_script(staged: &str) -> String {
    format!(
        "set -e; mkdir -p /usr/local/share/ca-certificates /etc/ssl/certs; \
         cp {staged} {GUEST_CA_FILE}; cat {GUEST_CA_FILE} >> {GUEST_BUNDLE}"
    )
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
