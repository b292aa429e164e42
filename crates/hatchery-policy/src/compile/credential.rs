//! Credential bindings: a rule of the `egress` tool may name a stored
//! secret that the egress proxy adds to matching HTTPS requests to the
//! rule's hosts, so the sandbox never holds it (docs/policy.md,
//! "Credentials"). The binding's document form is in [`crate::binding`];
//! this module is its validation (a binding that could leak the secret to
//! more than the named destinations is refused here, at the edge) and the
//! per-request match the proxy runs. Which rules' credentials hold for a
//! destination is the evaluator's (`Policy::credentials_for`, eval.rs).

use super::{CompiledRule, HostPattern};
pub use crate::binding::{CredentialBinding, Injection, Scheme};
use crate::document::{Effect, Rule};

/// Longest header template, username or path prefix.
pub const MAX_TEMPLATE_BYTES: usize = 256;
pub const MAX_PATH_PREFIX_BYTES: usize = 1024;
/// Most methods one binding names.
pub const MAX_METHODS: usize = 16;
/// The placeholder the template's secret goes into.
pub const SECRET_SLOT: &str = "{secret}";

/// Secret names: `[A-Za-z0-9_.-]`, 1–64 characters (the secrets API uses
/// the same rule).
pub fn valid_secret_name(n: &str) -> bool {
    (1..=64).contains(&n.len())
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

fn valid_token(s: &str, max: usize) -> bool {
    (1..=max).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

fn printable(s: &str) -> bool {
    s.bytes().all(|b| (0x20..0x7f).contains(&b))
}

/// A checked binding, as the proxy uses it.
#[derive(Debug, Clone, PartialEq)]
pub struct Credential {
    pub rule_id: String,
    pub secret: String,
    pub inject: Injection,
    pub methods: Option<Vec<String>>,
    pub path_prefix: String,
    pub scheme: Scheme,
    pub env: Option<String>,
}

impl Credential {
    /// Whether a request with this method and path (the request target's
    /// path, query included or not) gets the secret.
    pub fn applies(&self, method: &str, path: &str) -> bool {
        if let Some(m) = &self.methods {
            if !m.iter().any(|x| x == method) {
                return false;
            }
        }
        let path = path.split(['?', '#']).next().unwrap_or("");
        if !path.starts_with('/') || walks_out(path) {
            return false;
        }
        path.starts_with(&self.path_prefix)
    }
}

/// `.`/`..` segments (plain or percent-encoded) and backslashes: a server
/// may normalise them after the prefix was checked.
fn walks_out(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    lower.contains("%2e")
        || lower.contains("%2f")
        || lower.contains('\\')
        || lower.contains("%5c")
        || path.split('/').any(|seg| seg == "." || seg == "..")
}

/// Checks a rule's binding; the error text goes into the rule's
/// validation error.
pub(crate) fn compile(rule: &Rule, compiled: &CompiledRule) -> Result<Option<Credential>, String> {
    let Some(b) = &rule.credential else {
        return Ok(None);
    };
    let err = |m: &str| Err(format!("credential: {m}"));
    if rule.effect != Effect::Allow {
        return err("only an allow rule may carry a credential");
    }
    match &compiled.tools {
        Some(t) if t.iter().all(|p| p == crate::document::EGRESS_TOOL) => {}
        _ => {
            return err(
                "the rule must match exactly the tool \"egress\" (match.tools: [\"egress\"])",
            )
        }
    }
    if !compiled.args.is_empty() || compiled.cost.is_some() {
        return err("a credential rule matches on hosts and ports only");
    }
    if compiled.ports.is_none() {
        return err("the rule must name its ports (match.ports)");
    }
    let Some(hosts) = &compiled.hosts else {
        return err(
            "the rule must name its hosts (match.hosts); a credential is never bound to every host",
        );
    };
    for h in hosts {
        match h {
            HostPattern::Exact(_) => {}
            // `*.com` would send it to a whole top-level domain.
            HostPattern::Below(suffix) if suffix.matches('.').count() >= 2 => {}
            HostPattern::Below(suffix) => {
                return Err(format!(
                    "credential: host pattern *{suffix} is too wide; name a domain below a public suffix (*.example.com)"
                ))
            }
            HostPattern::Cidr(ip, len) if *len == if ip.is_ipv4() { 32 } else { 128 } => {}
            HostPattern::Cidr(ip, len) => {
                return Err(format!(
                    "credential: address range {ip}/{len} is refused; name single addresses or host names"
                ))
            }
        }
    }
    if b.scheme == Scheme::Http {
        let loopback = hosts
            .iter()
            .all(|h| matches!(h, HostPattern::Cidr(ip, _) if ip.is_loopback()));
        if !loopback {
            return err("injection into plain HTTP is refused (anyone on the path reads it); scheme \"http\" is allowed only when every host is a loopback address (tests)");
        }
    }
    if !valid_secret_name(&b.secret) {
        return err("secret must be a name of 1–64 characters of [A-Za-z0-9_.-]");
    }
    match &b.inject {
        Injection::Header { name, template } => {
            if !valid_token(name, 64) {
                return err("inject.header.name is not an HTTP header name");
            }
            let lower = name.to_ascii_lowercase();
            if matches!(
                lower.as_str(),
                "host"
                    | "content-length"
                    | "transfer-encoding"
                    | "connection"
                    | "upgrade"
                    | "te"
                    | "trailer"
                    | "keep-alive"
                    | "proxy-authorization"
                    | "proxy-connection"
            ) {
                return Err(format!(
                    "credential: inject.header.name {name:?} is a header the proxy owns"
                ));
            }
            if template.len() > MAX_TEMPLATE_BYTES || !printable(template) {
                return Err(format!(
                    "credential: inject.header.template must be at most {MAX_TEMPLATE_BYTES} printable ASCII bytes"
                ));
            }
            if template.matches(SECRET_SLOT).count() != 1 {
                return err("inject.header.template must contain {secret} exactly once");
            }
        }
        Injection::Basic { username } => {
            if username.len() > MAX_TEMPLATE_BYTES || !printable(username) || username.contains(':')
            {
                return Err(format!(
                    "credential: inject.basic.username must be at most {MAX_TEMPLATE_BYTES} printable ASCII bytes without ':'"
                ));
            }
        }
        Injection::Query { param } => {
            if !valid_secret_name(param) {
                return err("inject.query.param must be 1–64 characters of [A-Za-z0-9_.-]");
            }
        }
    }
    if let Some(m) = &b.methods {
        if m.is_empty() || m.len() > MAX_METHODS {
            return Err(format!(
                "credential: methods must name 1–{MAX_METHODS} methods; omit it for any"
            ));
        }
        if !m
            .iter()
            .all(|x| valid_token(x, 16) && x.bytes().all(|c| c.is_ascii_uppercase()))
        {
            return err("methods are upper-case HTTP method names (GET, POST, ...)");
        }
    }
    let prefix = b.path_prefix.clone().unwrap_or_else(|| "/".into());
    if !prefix.starts_with('/')
        || prefix.len() > MAX_PATH_PREFIX_BYTES
        || !prefix.bytes().all(|c| c.is_ascii_graphic())
        || prefix.contains(['?', '#'])
        || walks_out(&prefix)
    {
        return Err(format!(
            "credential: path_prefix must start with '/', be at most {MAX_PATH_PREFIX_BYTES} visible ASCII bytes, with no query, no '.'/'..' segments and no encoded dots"
        ));
    }
    if let Some(e) = &b.env {
        let ok = (1..=64).contains(&e.len())
            && !e.as_bytes()[0].is_ascii_digit()
            && e.bytes()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == b'_');
        if !ok {
            return err("env must be an upper-case variable name ([A-Z_][A-Z0-9_]*, at most 64)");
        }
    }
    Ok(Some(Credential {
        rule_id: rule.id.clone(),
        secret: b.secret.clone(),
        inject: b.inject.clone(),
        methods: b.methods.clone(),
        path_prefix: prefix,
        scheme: b.scheme,
        env: b.env.clone(),
    }))
}

#[cfg(test)]
mod tests {
    use crate::compile::{Policy, ValidationError};
    use crate::document::PolicyDocument;
    use crate::eval::Destination;
    use serde_json::{json, Value};

    fn compile(rule: Value) -> Result<Policy, ValidationError> {
        let doc: PolicyDocument =
            serde_json::from_value(json!({"name": "t", "rules": [rule]})).unwrap();
        Policy::compile(&doc)
    }

    fn rule(hosts: Value, cred: Value) -> Value {
        json!({"id": "c", "effect": "allow",
               "match": {"tools": ["egress"], "hosts": hosts, "ports": [443]},
               "credential": cred})
    }

    fn bearer() -> Value {
        json!({"secret": "GH_TOKEN", "inject": {"header": {"name": "Authorization", "template": "Bearer {secret}"}}})
    }

    #[test]
    fn a_good_binding_matches_its_hosts_methods_and_paths() {
        let mut c = bearer();
        c["methods"] = json!(["GET"]);
        c["path_prefix"] = json!("/api/");
        let p = compile(rule(json!(["api.example.com", "*.corp.example.com"]), c)).unwrap();
        fn d(host: &str) -> Destination<'_> {
            Destination {
                host,
                ip: None,
                port: 443,
            }
        }
        assert_eq!(p.credentials_for(&d("api.example.com")).len(), 1);
        assert_eq!(p.credentials_for(&d("x.corp.example.com")).len(), 1);
        assert!(p.credentials_for(&d("example.com")).is_empty());
        assert!(p
            .credentials_for(&Destination {
                host: "api.example.com",
                ip: None,
                port: 80
            })
            .is_empty());
        let c = p.credentials_for(&d("api.example.com"))[0];
        assert!(c.applies("GET", "/api/x?y=1"));
        assert!(!c.applies("POST", "/api/x"));
        assert!(!c.applies("GET", "/other"));
        for walk in [
            "/api/../other",
            "/api/%2e%2e/other",
            "/api/.%2E/x",
            "/api/..\\x",
            "/api/%2F",
        ] {
            assert!(!c.applies("GET", walk), "{walk}");
        }
    }

    #[test]
    fn wide_or_unsafe_bindings_are_refused() {
        for (hosts, cred, needle) in [
            (json!(["*.com"]), bearer(), "too wide"),
            (json!(["10.0.0.0/8"]), bearer(), "address range"),
            (
                json!(["api.example.com"]),
                json!({"secret": "a b", "inject": {"query": {"param": "t"}}}),
                "secret must be",
            ),
            (
                json!(["api.example.com"]),
                json!({"secret": "S", "inject": {"header": {"name": "Authorization", "template": "Bearer"}}}),
                "exactly once",
            ),
            (
                json!(["api.example.com"]),
                json!({"secret": "S", "inject": {"header": {"name": "Host", "template": "{secret}"}}}),
                "proxy owns",
            ),
            (
                json!(["api.example.com"]),
                json!({"secret": "S", "inject": {"header": {"name": "X", "template": "a\r\nb{secret}"}}}),
                "printable",
            ),
            (
                json!(["api.example.com"]),
                json!({"secret": "S", "inject": {"basic": {"username": "a:b"}}}),
                "without ':'",
            ),
            (
                json!(["api.example.com"]),
                json!({"secret": "S", "scheme": "http", "inject": {"query": {"param": "t"}}}),
                "plain HTTP",
            ),
            (
                json!(["api.example.com"]),
                json!({"secret": "S", "methods": ["get"], "inject": {"query": {"param": "t"}}}),
                "upper-case",
            ),
            (
                json!(["api.example.com"]),
                json!({"secret": "S", "path_prefix": "/a/../b", "inject": {"query": {"param": "t"}}}),
                "path_prefix",
            ),
            (
                json!(["api.example.com"]),
                json!({"secret": "S", "env": "lower", "inject": {"query": {"param": "t"}}}),
                "env must",
            ),
        ] {
            let e = compile(rule(hosts.clone(), cred.clone()))
                .unwrap_err()
                .to_string();
            assert!(e.contains(needle), "{hosts} {cred}: {e}");
        }
        // `*` alone is not even a host pattern.
        assert!(compile(rule(json!(["*"]), bearer())).is_err());
        // Not on a deny rule, not without hosts or ports, not for another tool.
        let mut deny = rule(json!(["api.example.com"]), bearer());
        deny["effect"] = json!("deny");
        assert!(compile(deny)
            .unwrap_err()
            .to_string()
            .contains("only an allow rule"));
        let no_hosts = json!({"id": "c", "effect": "allow", "match": {"tools": ["egress"], "ports": [443]}, "credential": bearer()});
        assert!(compile(no_hosts)
            .unwrap_err()
            .to_string()
            .contains("never bound to every host"));
        let no_ports = json!({"id": "c", "effect": "allow", "match": {"tools": ["egress"], "hosts": ["a.example.com"]}, "credential": bearer()});
        assert!(compile(no_ports).unwrap_err().to_string().contains("ports"));
        let tool = json!({"id": "c", "effect": "allow", "match": {"tools": ["*"], "hosts": ["a.example.com"], "ports": [443]}, "credential": bearer()});
        assert!(compile(tool).unwrap_err().to_string().contains("egress"));
    }

    #[test]
    fn plain_http_only_for_loopback_addresses() {
        let c = json!({"secret": "S", "scheme": "http", "inject": {"query": {"param": "t"}}});
        assert!(compile(rule(json!(["127.0.0.2"]), c.clone())).is_ok());
        assert!(compile(rule(json!(["10.1.2.3"]), c)).is_err());
    }
}
