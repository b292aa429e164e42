//! The egress policy model and its validation.
//!
//! Evaluation order for a packet leaving a sandbox, first match wins:
//! 1. always-blocked ranges (metadata, private, loopback, multicast, every
//!    sandbox slot) and all IPv6: denied, whatever the policy says;
//! 2. the policy's `deny` rules: denied;
//! 3. the policy's `allow` rules: allowed;
//! 4. `egress`: `allow` lets the rest out, `deny` (the default) does not.
//!
//! So deny beats allow, and nothing beats the always-blocked list.

use crate::{Cidr, NetError};
use serde::{Deserialize, Serialize};
use std::net::Ipv4Addr;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Egress {
    #[default]
    Deny,
    Allow,
}

/// One destination: exactly one of `cidr` and `host`. No `ports` means
/// every port and protocol (ICMP included); with `ports`, TCP and UDP to
/// those ports only.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cidr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<u16>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    #[serde(default)]
    pub egress: Egress,
    #[serde(default)]
    pub allow: Vec<Rule>,
    #[serde(default)]
    pub deny: Vec<Rule>,
}

/// Caps on a policy's size, so one request cannot make a huge ruleset.
#[derive(Debug, Clone, Copy)]
pub struct PolicyLimits {
    pub max_rules: usize,
    pub max_ports: usize,
}

impl Default for PolicyLimits {
    fn default() -> Self {
        PolicyLimits {
            max_rules: 64,
            max_ports: 16,
        }
    }
}

/// Ranges no policy can open: cloud metadata and link-local, private and
/// carrier-grade NAT ranges (internal services, other tenants), loopback,
/// "this network", multicast and reserved space.
pub const ALWAYS_BLOCKED: &[&str] = &[
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "224.0.0.0/4",
    "240.0.0.0/4",
];

/// A rule with its destination resolved to addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compiled {
    pub nets: Vec<Cidr>,
    pub ports: Vec<u16>,
}

impl Rule {
    fn target(&self) -> Result<Target<'_>, NetError> {
        match (&self.cidr, &self.host) {
            (Some(c), None) => Ok(Target::Cidr(c.parse()?)),
            (None, Some(h)) => {
                valid_host(h)?;
                Ok(Target::Host(h))
            }
            _ => Err(NetError::Invalid(
                "each rule needs exactly one of \"cidr\" and \"host\"".into(),
            )),
        }
    }

    /// Resolves the rule with `resolve` (host names only).
    pub fn compile(
        &self,
        resolve: &dyn Fn(&str) -> Result<Vec<Ipv4Addr>, NetError>,
    ) -> Result<Compiled, NetError> {
        let nets = match self.target()? {
            Target::Cidr(c) => vec![c],
            Target::Host(h) => resolve(h)?.into_iter().map(|a| Cidr::new(a, 32)).collect(),
        };
        Ok(Compiled {
            nets,
            ports: self.ports.clone(),
        })
    }
}

enum Target<'a> {
    Cidr(Cidr),
    Host(&'a str),
}

fn valid_host(h: &str) -> Result<(), NetError> {
    let ok = !h.is_empty()
        && h.len() <= 253
        && h.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
        // An address belongs in `cidr`, where it is not looked up.
        && h.parse::<Ipv4Addr>().is_err();
    if ok {
        Ok(())
    } else {
        Err(NetError::Invalid(format!("{h:?} is not a valid host name")))
    }
}

impl Policy {
    /// The default for every sandbox: nothing leaves.
    pub fn deny_all() -> Policy {
        Policy::default()
    }

    pub fn validate(&self, limits: PolicyLimits) -> Result<(), NetError> {
        for (name, rules) in [("allow", &self.allow), ("deny", &self.deny)] {
            if rules.len() > limits.max_rules {
                return Err(NetError::Invalid(format!(
                    "{name} has {} rules; at most {} are allowed",
                    rules.len(),
                    limits.max_rules
                )));
            }
            for r in rules {
                r.target()?;
                if r.ports.len() > limits.max_ports {
                    return Err(NetError::Invalid(format!(
                        "a rule lists {} ports; at most {} are allowed",
                        r.ports.len(),
                        limits.max_ports
                    )));
                }
                if r.ports.contains(&0) {
                    return Err(NetError::Invalid("port 0 is not a valid port".into()));
                }
            }
        }
        Ok(())
    }

    pub fn has_hosts(&self) -> bool {
        self.allow
            .iter()
            .chain(&self.deny)
            .any(|r| r.host.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(cidr: Option<&str>, host: Option<&str>, ports: &[u16]) -> Rule {
        Rule {
            cidr: cidr.map(Into::into),
            host: host.map(Into::into),
            ports: ports.to_vec(),
        }
    }

    #[test]
    fn validation_rejects_what_it_must() {
        let l = PolicyLimits::default();
        assert!(Policy::deny_all().validate(l).is_ok());
        let bad_rules = [
            rule(None, None, &[]),
            rule(Some("1.2.3.0/24"), Some("a.example"), &[]),
            rule(Some("::/0"), None, &[]),
            rule(Some("1.2.3.4/40"), None, &[]),
            rule(None, Some("-bad.example"), &[]),
            rule(None, Some("1.2.3.4"), &[]),
            rule(None, Some("a..b"), &[]),
            rule(None, Some("under_score.example"), &[]),
            rule(Some("1.2.3.4"), None, &[0]),
        ];
        for r in bad_rules {
            let p = Policy {
                allow: vec![r.clone()],
                ..Default::default()
            };
            assert!(p.validate(l).is_err(), "{r:?}");
        }
        let many = Policy {
            deny: vec![rule(Some("1.2.3.4"), None, &[]); 65],
            ..Default::default()
        };
        assert!(many.validate(l).is_err());
        let at_cap = Policy {
            deny: vec![rule(Some("1.2.3.4"), None, &[1; 16]); 64],
            ..Default::default()
        };
        assert!(at_cap.validate(l).is_ok());
        let ports = Policy {
            allow: vec![rule(Some("1.2.3.4"), None, &[1; 17])],
            ..Default::default()
        };
        assert!(ports.validate(l).is_err());
    }

    #[test]
    fn json_shape_round_trips() {
        let p: Policy = serde_json::from_str(
            r#"{"egress":"allow","allow":[{"host":"pypi.example","ports":[443]}],"deny":[{"cidr":"203.0.113.0/24"}]}"#,
        )
        .unwrap();
        assert_eq!(p.egress, Egress::Allow);
        assert!(p.has_hosts());
        let back: Policy = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
        assert_eq!(p, back);
        assert!(serde_json::from_str::<Policy>(r#"{"egress":"maybe"}"#).is_err());
        assert!(
            serde_json::from_str::<Policy>(r#"{"allow":[{"cidr":"1.2.3.4","port":1}]}"#).is_err()
        );
        assert_eq!(
            serde_json::from_str::<Policy>("{}").unwrap(),
            Policy::deny_all()
        );
    }

    #[test]
    fn hosts_compile_to_pinned_addresses() {
        let r = rule(None, Some("pypi.example"), &[443]);
        let c = r
            .compile(&|h| {
                assert_eq!(h, "pypi.example");
                Ok(vec!["198.51.100.7".parse().unwrap()])
            })
            .unwrap();
        assert_eq!(c.nets, vec!["198.51.100.7/32".parse().unwrap()]);
        assert_eq!(c.ports, vec![443]);
    }
}
