//! The evaluator: rules in order, the first whose match holds decides, and a
//! request that no rule matches is denied. Evaluation allocates nothing and
//! never fails; a malformed request simply matches fewer rules.

use crate::compile::{CompiledCond, CompiledRule, HostPattern, Operand, Policy};
use crate::document::{Effect, Op};
use serde_json::{Map, Value};
use std::cmp::Ordering;
use std::net::IpAddr;

/// What is being asked for.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The tool name; the egress proxy uses [`EGRESS_TOOL`].
    pub tool: &'a str,
    /// The call's JSON arguments (`Value::Null` when there are none).
    pub args: &'a Value,
    /// Estimated cost in cents, when the caller can estimate one.
    pub cost_cents: Option<i64>,
    pub dest: Option<Destination<'a>>,
    /// Values rules may compare with through `{"ctx": "name"}`, e.g.
    /// `session_branch`. Supplied by the host side, never by the agent.
    pub ctx: Option<&'a Map<String, Value>>,
}

pub use crate::document::{EGRESS_TOOL, MODEL_CALL_TOOL, REPLAY_DIVERGED_TOOL};

#[derive(Debug, Clone, Copy)]
pub struct Destination<'a> {
    /// Normalised host: lower-case ASCII name without a trailing dot, or an
    /// IP literal.
    pub host: &'a str,
    /// The address that will be dialled, once resolved.
    pub ip: Option<IpAddr>,
    pub port: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision<'p> {
    pub effect: Effect,
    /// The rule that decided; `None` for the default deny.
    pub rule_index: Option<usize>,
    pub rule_id: Option<&'p str>,
    /// The host condition held because a CIDR or IP pattern contains the
    /// destination's address (not because of its name). The egress proxy
    /// lets a special-purpose address (loopback, private, ...) through only
    /// then.
    pub matched_address_range: bool,
}

impl<'p> Decision<'p> {
    pub const DEFAULT_DENY: Decision<'static> = Decision {
        effect: Effect::Deny,
        rule_index: None,
        rule_id: None,
        matched_address_range: false,
    };
}

impl Policy {
    pub fn evaluate<'p>(&'p self, req: &Request<'_>) -> Decision<'p> {
        for (i, rule) in self.rules.iter().enumerate() {
            if let Some(by_range) = rule_matches(rule, req) {
                return Decision {
                    effect: rule.effect,
                    rule_index: Some(i),
                    rule_id: Some(&rule.id),
                    matched_address_range: by_range,
                };
            }
        }
        Decision::DEFAULT_DENY
    }
}

/// `Some(matched_by_address_range)` when the rule holds.
fn rule_matches(rule: &CompiledRule, req: &Request<'_>) -> Option<bool> {
    if let Some(tools) = &rule.tools {
        if !tools.iter().any(|p| crate::glob::matches(p, req.tool)) {
            return None;
        }
    }
    if let Some((op, v)) = rule.cost {
        let c = req.cost_cents?;
        if !compare_ord(op, c.cmp(&v)) {
            return None;
        }
    }
    let mut by_range = false;
    if rule.hosts.is_some() || rule.ports.is_some() {
        let d = req.dest.as_ref()?;
        if let Some(ports) = &rule.ports {
            if !ports.iter().any(|&(lo, hi)| (lo..=hi).contains(&d.port)) {
                return None;
            }
        }
        if let Some(hosts) = &rule.hosts {
            by_range = host_matches(hosts, d)?;
        }
    }
    for c in &rule.args {
        if !cond_holds(c, req) {
            return None;
        }
    }
    Some(by_range)
}

/// `Some(by_range)` when one pattern matches. Name patterns are tried
/// first, so `by_range` is only true when no name pattern matched.
pub(crate) fn host_matches(hosts: &[HostPattern], d: &Destination<'_>) -> Option<bool> {
    let literal: Option<IpAddr> = d.host.parse().ok();
    let mut range = false;
    for h in hosts {
        match h {
            HostPattern::Exact(n) => {
                if literal.is_none() && d.host == n {
                    return Some(false);
                }
            }
            HostPattern::Below(suffix) => {
                if literal.is_none()
                    && d.host.len() > suffix.len()
                    && d.host.ends_with(suffix.as_str())
                {
                    return Some(false);
                }
            }
            HostPattern::Cidr(net, len) => {
                if let Some(ip) = d.ip.or(literal) {
                    if in_range(ip, *net, *len) {
                        range = true;
                    }
                }
            }
        }
    }
    range.then_some(true)
}

pub(crate) fn in_range(ip: IpAddr, net: IpAddr, len: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(_), IpAddr::V4(_)) | (IpAddr::V6(_), IpAddr::V6(_)) => {
            crate::compile::mask(ip, len) == net
        }
        _ => false,
    }
}

fn lookup<'v>(root: &'v Value, path: &[String]) -> Option<&'v Value> {
    let mut v = root;
    for seg in path {
        v = match v {
            Value::Object(o) => o.get(seg.as_str())?,
            Value::Array(a) => a.get(seg.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(v)
}

fn cond_holds(c: &CompiledCond, req: &Request<'_>) -> bool {
    let field = lookup(req.args, &c.path);
    match c.op {
        Op::Exists => return field.is_some(),
        Op::Absent => return field.is_none(),
        _ => {}
    }
    let Some(field) = field else { return false };
    let operand = match &c.operand {
        Operand::Value(v) => v,
        Operand::Ctx(name) => match req.ctx.and_then(|m| m.get(name.as_str())) {
            Some(v) => v,
            // A rule that compares with a context value the caller did not
            // supply cannot hold, for `ne` as much as for `eq`.
            None => return false,
        },
        Operand::None => return false,
    };
    match c.op {
        Op::Eq => same_type(field, operand) && json_eq(field, operand),
        Op::Ne => same_type(field, operand) && !json_eq(field, operand),
        Op::Gt | Op::Ge | Op::Lt | Op::Le => match num_cmp(field, operand) {
            Some(o) => compare_ord(c.op, o),
            None => false,
        },
        Op::Glob => match (field, operand) {
            (Value::String(f), Value::String(p)) => crate::glob::matches(p, f),
            _ => false,
        },
        Op::Prefix => match (field, operand) {
            (Value::String(f), Value::String(p)) => f.starts_with(p.as_str()),
            _ => false,
        },
        Op::In | Op::NotIn => {
            let Value::Array(items) = operand else {
                return false;
            };
            if !items.first().is_some_and(|x| same_type(field, x)) {
                return false;
            }
            let found = items.iter().any(|x| json_eq(field, x));
            found == (c.op == Op::In)
        }
        Op::Exists | Op::Absent => unreachable!("handled above"),
    }
}

fn same_type(a: &Value, b: &Value) -> bool {
    std::mem::discriminant(a) == std::mem::discriminant(b)
}

fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(_), Value::Number(_)) => num_cmp(a, b) == Some(Ordering::Equal),
        _ => a == b,
    }
}

fn num_cmp(a: &Value, b: &Value) -> Option<Ordering> {
    let (Value::Number(x), Value::Number(y)) = (a, b) else {
        return None;
    };
    if let (Some(x), Some(y)) = (x.as_i64(), y.as_i64()) {
        return Some(x.cmp(&y));
    }
    x.as_f64()?.partial_cmp(&y.as_f64()?)
}

fn compare_ord(op: Op, o: Ordering) -> bool {
    match op {
        Op::Eq => o == Ordering::Equal,
        Op::Ne => o != Ordering::Equal,
        Op::Gt => o == Ordering::Greater,
        Op::Ge => o != Ordering::Less,
        Op::Lt => o == Ordering::Less,
        Op::Le => o != Ordering::Greater,
        _ => false,
    }
}

impl crate::compile::Policy {
    /// The credential rules whose hosts and ports hold for `dest`, in rule
    /// order (the proxy intercepts a connection when there is one, and
    /// gives a request the first whose method and path hold).
    pub fn credentials_for(
        &self,
        dest: &Destination<'_>,
    ) -> Vec<&crate::compile::credential::Credential> {
        self.rules
            .iter()
            .filter_map(|r| {
                let c = r.credential.as_ref()?;
                let ports = r.ports.as_ref()?;
                if !ports.iter().any(|&(lo, hi)| (lo..=hi).contains(&dest.port)) {
                    return None;
                }
                host_matches(r.hosts.as_ref()?, dest)?;
                Some(c)
            })
            .collect()
    }

    /// Every credential binding of the policy (secret names for the edge's
    /// check, placeholder variables for the agent's environment).
    pub fn credentials(&self) -> impl Iterator<Item = &crate::compile::credential::Credential> {
        self.rules.iter().filter_map(|r| r.credential.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::document::PolicyDocument;
    use serde_json::json;

    fn policy(rules: Value) -> Policy {
        let d: PolicyDocument =
            serde_json::from_value(json!({"name": "t", "rules": rules})).unwrap();
        Policy::compile(&d).unwrap()
    }

    fn call<'a>(tool: &'a str, args: &'a Value) -> Request<'a> {
        Request {
            tool,
            args,
            cost_cents: None,
            dest: None,
            ctx: None,
        }
    }

    #[test]
    fn first_match_wins_and_default_deny() {
        let p = policy(json!([
            {"id": "no-main", "effect": "deny", "match": {"tools": ["git_push"], "args": [{"field": "branch", "op": "eq", "value": "main"}]}},
            {"id": "push", "effect": "allow", "match": {"tools": ["git_push"]}},
            {"id": "push-again", "effect": "require_approval", "match": {"tools": ["git_push"]}}
        ]));
        let main = json!({"branch": "main"});
        let d = p.evaluate(&call("git_push", &main));
        assert_eq!(
            (d.effect, d.rule_index, d.rule_id),
            (Effect::Deny, Some(0), Some("no-main"))
        );
        let feat = json!({"branch": "feat"});
        let d = p.evaluate(&call("git_push", &feat));
        assert_eq!((d.effect, d.rule_id), (Effect::Allow, Some("push")));
        let d = p.evaluate(&call("rm_rf", &feat));
        assert_eq!(d, Decision::DEFAULT_DENY);
        assert_eq!(
            policy(json!([])).evaluate(&call("x", &Value::Null)),
            Decision::DEFAULT_DENY
        );
    }

    #[test]
    fn numeric_and_string_ops() {
        let p = policy(json!([
            {"id": "big", "effect": "require_approval", "match": {"args": [{"field": "diff.lines", "op": "gt", "value": 500}]}},
            {"id": "docs", "effect": "allow", "match": {"args": [{"field": "path", "op": "glob", "value": "docs/*.md"}]}},
            {"id": "tmp", "effect": "allow", "match": {"args": [{"field": "path", "op": "prefix", "value": "/tmp/"}]}},
            {"id": "lang", "effect": "allow", "match": {"args": [{"field": "lang", "op": "in", "value": ["py", "js"]}]}},
            {"id": "first-file", "effect": "allow", "match": {"args": [{"field": "files.0", "op": "eq", "value": "a"}]}}
        ]));
        let eff = |v: Value| p.evaluate(&call("t", &v)).rule_id;
        assert_eq!(eff(json!({"diff": {"lines": 501}})), Some("big"));
        assert_eq!(eff(json!({"diff": {"lines": 500}})), None);
        assert_eq!(eff(json!({"diff": {"lines": 500.5}})), Some("big"));
        assert_eq!(
            eff(json!({"diff": {"lines": "9999"}})),
            None,
            "a string is not a number"
        );
        assert_eq!(eff(json!({"path": "docs/a.md"})), Some("docs"));
        assert_eq!(eff(json!({"path": "docs/a.md.sh"})), None);
        assert_eq!(eff(json!({"path": "/tmp/x"})), Some("tmp"));
        assert_eq!(eff(json!({"lang": "js"})), Some("lang"));
        assert_eq!(eff(json!({"lang": "rb"})), None);
        assert_eq!(eff(json!({"lang": ["js"]})), None);
        assert_eq!(eff(json!({"files": ["a", "b"]})), Some("first-file"));
    }

    #[test]
    fn wrong_types_never_satisfy_ne() {
        let p = policy(json!([
            {"id": "not-main", "effect": "allow", "match": {"args": [{"field": "branch", "op": "ne", "value": "main"}]}},
            {"id": "not-listed", "effect": "allow", "match": {"args": [{"field": "b", "op": "not_in", "value": ["main", "master"]}]}}
        ]));
        for v in [
            json!({"branch": ["main"]}),
            json!({"branch": null}),
            json!({}),
            json!({"b": 1}),
        ] {
            assert_eq!(p.evaluate(&call("t", &v)).effect, Effect::Deny, "{v}");
        }
        assert_eq!(
            p.evaluate(&call("t", &json!({"branch": "dev"}))).effect,
            Effect::Allow
        );
        assert_eq!(
            p.evaluate(&call("t", &json!({"b": "dev"}))).rule_id,
            Some("not-listed")
        );
        assert_eq!(
            p.evaluate(&call("t", &json!({"b": "main"}))).effect,
            Effect::Deny
        );
    }

    #[test]
    fn context_values() {
        let p = policy(json!([
            {"id": "own", "effect": "allow", "match": {"args": [{"field": "branch", "op": "eq", "value": {"ctx": "session_branch"}}]}}
        ]));
        let mut ctx = Map::new();
        ctx.insert("session_branch".into(), json!("hatchery/s1"));
        let args = json!({"branch": "hatchery/s1"});
        let mut r = call("git_push", &args);
        assert_eq!(p.evaluate(&r).effect, Effect::Deny, "no context: no match");
        r.ctx = Some(&ctx);
        assert_eq!(p.evaluate(&r).effect, Effect::Allow);
        let other = json!({"branch": "hatchery/s2"});
        r.args = &other;
        assert_eq!(p.evaluate(&r).effect, Effect::Deny);
    }

    #[test]
    fn cost() {
        let p = policy(json!([
            {"id": "cheap", "effect": "allow", "match": {"cost": {"op": "le", "value": 100}}},
            {"id": "dear", "effect": "require_approval", "match": {"cost": {"op": "gt", "value": 100}}}
        ]));
        let mut r = call("llm", &Value::Null);
        assert_eq!(p.evaluate(&r).effect, Effect::Deny, "no estimate: no match");
        r.cost_cents = Some(100);
        assert_eq!(p.evaluate(&r).rule_id, Some("cheap"));
        r.cost_cents = Some(101);
        assert_eq!(p.evaluate(&r).rule_id, Some("dear"));
    }

    #[test]
    fn hosts_and_ports() {
        let p = policy(json!([
            {"id": "pypi", "effect": "allow", "match": {"tools": ["egress"], "hosts": ["pypi.org", "*.pythonhosted.org"], "ports": [443]}},
            {"id": "lo", "effect": "allow", "match": {"hosts": ["127.0.0.0/8"], "ports": ["8000-8999"]}},
            {"id": "v6", "effect": "allow", "match": {"hosts": ["fd00::/8"]}}
        ]));
        let d = |host: &'static str, ip: Option<&str>, port: u16| {
            let req = Request {
                tool: "egress",
                args: &Value::Null,
                cost_cents: None,
                dest: Some(Destination {
                    host,
                    ip: ip.map(|i| i.parse().unwrap()),
                    port,
                }),
                ctx: None,
            };
            let dec = p.evaluate(&req);
            (dec.rule_id, dec.matched_address_range)
        };
        assert_eq!(
            d("pypi.org", Some("151.101.0.223"), 443),
            (Some("pypi"), false)
        );
        assert_eq!(d("pypi.org", None, 80), (None, false));
        assert_eq!(
            d("files.pythonhosted.org", None, 443),
            (Some("pypi"), false)
        );
        assert_eq!(
            d("pythonhosted.org", None, 443),
            (None, false),
            "*.x is below x only"
        );
        assert_eq!(d("evilpythonhosted.org", None, 443), (None, false));
        assert_eq!(d("localhost", Some("127.0.0.1"), 8080), (Some("lo"), true));
        assert_eq!(d("127.0.0.1", None, 8080), (Some("lo"), true));
        assert_eq!(d("127.0.0.1", None, 9000), (None, false));
        assert_eq!(d("10.0.0.1", None, 8080), (None, false));
        assert_eq!(d("fd12::1", None, 1), (Some("v6"), true));
        // A literal that is spelled like a name pattern never matches one.
        let none = call("egress", &Value::Null);
        assert_eq!(
            p.evaluate(&none).rule_id,
            None,
            "no destination: host rules do not match"
        );
    }
}
