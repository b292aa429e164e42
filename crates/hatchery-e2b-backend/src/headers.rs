//! E2B's header transforms (`network.rules`) on Hatchery: each header a
//! credential binding of the egress proxy (docs/e2b.md, "Header
//! transforms"; policy.md, "Credentials"). Its value is stored sealed in
//! the secrets store under a name of the sandbox's ([`secret_name`]), and
//! the sandbox is bound at the proxy with a policy of its own
//! ([`policy`]): the sandbox's egress options mirrored (so the proxy,
//! which dials from the host, opens nothing the sandbox's firewall keeps
//! closed) and, after them, one credential rule per header. The sandbox
//! gets the proxy's variables and trusts its CA; the value never enters
//! it. [`EgressHeaders`] is what the daemon's proxy and secrets store give
//! (hatchery-agents implements it).

use hatchery_e2b::backend::{Dest, HeaderRule, NetworkSpec};
use hatchery_policy::{Policy, PolicyDocument, ValidationError};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The names of sandbox-scoped header values in the secrets store
/// (`e2b.<sandbox id>.<n>`); `/v1/secrets` refuses names that start so,
/// and `/v1/policies` documents that bind one: only [`policy`] binds them.
pub const SECRET_PREFIX: &str = hatchery_policy::secret_scope::ADAPTER_PREFIX;

/// Why the store did not take (or list) a header value.
#[derive(Debug, thiserror::Error)]
pub enum HeaderError {
    /// The deployment's secrets cap is reached.
    #[error("the secrets store is full ({0} secrets)")]
    Full(u64),
    #[error("secrets store")]
    Store(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// The daemon's egress proxy and secrets store, as E2B sandboxes with
/// header transforms use them.
#[async_trait::async_trait]
pub trait EgressHeaders: Send + Sync + 'static {
    /// The sandbox's variables `own` with those that point its clients at
    /// the proxy and make them trust its CA added (the sandbox's own win).
    fn guest_env(&self, own: &BTreeMap<String, String>) -> BTreeMap<String, String>;
    /// The proxy's CA certificate (PEM).
    fn ca_pem(&self) -> String;
    /// The root shell script that installs the CA written at `staged`.
    fn ca_install_script(&self, staged: &str) -> String;
    /// Stores `value` sealed as `name`.
    async fn seal(&self, name: &str, value: &str) -> Result<(), HeaderError>;
    /// Deletes a stored value (gone already is fine).
    async fn forget(&self, name: &str);
    /// Every stored name that starts with [`SECRET_PREFIX`].
    async fn sealed(&self) -> Result<Vec<String>, HeaderError>;
    /// The proxy decides `sandbox`'s connections by `policy` (again: the
    /// policy is replaced).
    fn bind(&self, sandbox: &str, policy: Arc<Policy>);
    /// The proxy refuses `sandbox`'s connections from now on.
    fn unbind(&self, sandbox: &str);
}

/// One header of a sandbox: where, which, and the stored value's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bound {
    pub host: String,
    pub header: String,
    pub secret: String,
}

/// The name the `n`th header value of `sandbox` is stored under.
pub fn secret_name(sandbox: &str, n: usize) -> String {
    format!("{SECRET_PREFIX}{sandbox}.{n}")
}

/// The sandbox a stored name belongs to, if it is a header value's.
pub fn sandbox_of(secret: &str) -> Option<&str> {
    secret
        .strip_prefix(SECRET_PREFIX)?
        .rsplit_once('.')
        .map(|(s, _)| s)
}

/// Each header with the name its value is stored under, in order.
pub fn bound(sandbox: &str, rules: &[HeaderRule]) -> Vec<(Bound, String)> {
    rules
        .iter()
        .flat_map(|r| r.headers.iter().map(move |h| (r, h)))
        .enumerate()
        .map(|(n, (r, (name, value)))| {
            (
                Bound {
                    host: r.host.clone(),
                    header: name.clone(),
                    secret: secret_name(sandbox, n),
                },
                value.clone(),
            )
        })
        .collect()
}

fn dest(d: &Dest) -> String {
    match d {
        Dest::Net { addr, prefix } => format!("{addr}/{prefix}"),
        Dest::Host(h) => h.clone(),
    }
}

fn egress(id: &str, effect: &str, hosts: Option<Vec<String>>) -> Value {
    let mut m = json!({"tools": ["egress"]});
    if let Some(h) = hosts {
        m["hosts"] = json!(h);
    }
    json!({"id": id, "effect": effect, "match": m})
}

/// The proxy's policy for a sandbox: its egress options (`None`:
/// Hatchery's default, everything denied) as the firewall applies them,
/// then the header bindings, which never decide whether a connection is
/// allowed (a rule above them always does) and only say what an allowed
/// one to their host gets (E2B: "a domain listed here is not
/// automatically allowed").
pub fn policy(
    sandbox: &str,
    net: Option<&NetworkSpec>,
    headers: &[Bound],
) -> Result<Policy, ValidationError> {
    let mut rules = Vec::new();
    // What no sandbox policy opens stays closed at the proxy too, whatever
    // is allowed (the proxy dials from the host).
    let blocked: Vec<String> = hatchery_net::policy::ALWAYS_BLOCKED
        .iter()
        .map(|c| c.to_string())
        .collect();
    rules.push(egress("always-blocked", "deny", Some(blocked)));
    let closed = NetworkSpec::default();
    let net = net.unwrap_or(&closed);
    if net.allow_all && !net.deny.is_empty() {
        rules.push(egress(
            "deny-out",
            "deny",
            Some(net.deny.iter().map(dest).collect()),
        ));
    }
    if !net.allow.is_empty() {
        rules.push(egress(
            "allow-out",
            "allow",
            Some(net.allow.iter().map(dest).collect()),
        ));
    }
    rules.push(if net.allow_all {
        egress("open", "allow", None)
    } else {
        egress("closed", "deny", None)
    });
    for (n, b) in headers.iter().enumerate() {
        rules.push(json!({
            "id": format!("header-{n}"),
            "effect": "allow",
            "match": {"tools": ["egress"], "hosts": [b.host], "ports": ["1-65535"]},
            "credential": {
                "secret": b.secret,
                "inject": {"header": {"name": b.header, "template": "{secret}"}}
            }
        }));
    }
    let doc: PolicyDocument = serde_json::from_value(json!({
        "name": format!("e2b network.rules of {sandbox}"),
        "rules": rules,
    }))
    .map_err(|e| ValidationError::Policy(e.to_string()))?;
    Policy::compile(&doc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hatchery_policy::{Destination, Effect, Request};
    use std::net::IpAddr;

    fn rules() -> Vec<HeaderRule> {
        vec![
            HeaderRule {
                host: "198.19.2.6".into(),
                headers: vec![("X-Api-Key".into(), "v1".into())],
            },
            HeaderRule {
                host: "*.api.example.com".into(),
                headers: vec![
                    ("Authorization".into(), "Bearer v2".into()),
                    ("X-Team".into(), "v3".into()),
                ],
            },
        ]
    }

    fn decide(p: &Policy, host: &str, ip: &str, port: u16) -> (Effect, usize) {
        let ip: IpAddr = ip.parse().unwrap();
        let dest = Destination {
            host,
            ip: Some(ip),
            port,
        };
        let d = p.evaluate(&Request {
            tool: "egress",
            args: &Value::Null,
            cost_cents: None,
            dest: Some(dest),
            ctx: None,
        });
        (d.effect, p.credentials_for(&dest).len())
    }

    #[test]
    fn names_are_the_sandboxs_own_and_fit_a_secret_name() {
        let b = bound("sbx_0123456789abcdef", &rules());
        let names: Vec<&str> = b.iter().map(|(b, _)| b.secret.as_str()).collect();
        assert_eq!(
            names,
            [
                "e2b.sbx_0123456789abcdef.0",
                "e2b.sbx_0123456789abcdef.1",
                "e2b.sbx_0123456789abcdef.2"
            ]
        );
        assert!(names
            .iter()
            .all(|n| hatchery_policy::credential::valid_secret_name(n)));
        assert_eq!(sandbox_of(names[2]), Some("sbx_0123456789abcdef"));
        assert_eq!(sandbox_of("GH_TOKEN"), None);
        assert_eq!(b[1].1, "Bearer v2");
    }

    #[test]
    fn headers_go_only_where_the_sandboxs_egress_already_goes() {
        let b: Vec<Bound> = bound("sbx_x", &rules())
            .into_iter()
            .map(|(b, _)| b)
            .collect();
        // Everything denied but one address: its header holds there; a
        // rules host not in allowOut stays denied (E2B: not allowed by
        // being listed); another address gets nothing.
        let deny_all = NetworkSpec {
            allow_all: false,
            allow: vec![Dest::Net {
                addr: "198.19.2.6".parse().unwrap(),
                prefix: 32,
            }],
            deny: vec![],
        };
        let p = policy("sbx_x", Some(&deny_all), &b).unwrap();
        assert_eq!(
            decide(&p, "198.19.2.6", "198.19.2.6", 8443),
            (Effect::Allow, 1)
        );
        assert_eq!(
            decide(&p, "198.19.2.10", "198.19.2.10", 8443).0,
            Effect::Deny
        );
        assert_eq!(
            decide(&p, "a.api.example.com", "203.0.113.7", 443),
            (Effect::Deny, 2)
        );
        // Open egress: the wildcard host gets both its headers, a
        // denyOut range stays denied, private ranges stay closed.
        let open = NetworkSpec {
            allow_all: true,
            allow: vec![],
            deny: vec![Dest::Net {
                addr: "203.0.113.0".parse().unwrap(),
                prefix: 24,
            }],
        };
        let p = policy("sbx_x", Some(&open), &b).unwrap();
        assert_eq!(
            decide(&p, "a.api.example.com", "192.0.2.7", 443),
            (Effect::Allow, 2)
        );
        assert_eq!(
            decide(&p, "api.example.com", "192.0.2.7", 443),
            (Effect::Allow, 0)
        );
        assert_eq!(decide(&p, "x.example", "203.0.113.9", 443).0, Effect::Deny);
        assert_eq!(decide(&p, "x.example", "10.0.0.1", 443).0, Effect::Deny);
        assert_eq!(decide(&p, "x.example", "127.0.0.1", 443).0, Effect::Deny);
        // No options: Hatchery's default, everything denied.
        let p = policy("sbx_x", None, &b).unwrap();
        assert_eq!(decide(&p, "198.19.2.6", "198.19.2.6", 443).0, Effect::Deny);
    }

    #[test]
    fn a_binding_the_policy_refuses_is_an_error_not_a_wider_rule() {
        let b = vec![Bound {
            host: "*.com".into(),
            header: "X".into(),
            secret: "e2b.sbx_x.0".into(),
        }];
        assert!(policy("sbx_x", None, &b).is_err());
    }
}
