//! Validation: a [`PolicyDocument`] becomes a [`Policy`] the evaluator runs,
//! or a [`ValidationError`] that names the rule (index and id) and the part
//! of it that is wrong. Everything the evaluator would otherwise re-parse per
//! request (paths, ports, CIDRs) is parsed here, once.

pub mod approval;
pub mod credential;

use crate::document::{ArgCondition, Effect, Op, PolicyDocument, Rule};
use serde_json::Value;
use std::collections::HashSet;
use std::net::IpAddr;

/// Caps on a document, so that a policy cannot make evaluation slow or the
/// store large. Documented in docs/policy.md.
pub const MAX_RULES: usize = 1000;
pub const MAX_CONDITIONS_PER_RULE: usize = 32;
pub const MAX_PATTERNS_PER_RULE: usize = 256;
pub const MAX_STRING_BYTES: usize = 1024;
pub const MAX_NAME_BYTES: usize = 200;
pub const MAX_DESCRIPTION_BYTES: usize = 4096;
pub const MAX_FIELD_DEPTH: usize = 8;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    #[error("policy: {0}")]
    Policy(String),
    #[error("rule {index} (id {id:?}): {message}")]
    Rule {
        index: usize,
        id: String,
        message: String,
    },
}

/// A checked policy, ready to evaluate.
#[derive(Debug, Clone)]
pub struct Policy {
    pub(crate) rules: Vec<CompiledRule>,
}

impl Policy {
    /// Whether a rule names `tool` in its `tools`. The model gateway asks
    /// before deciding a model call: policies written before model calls
    /// were evaluated say nothing about them, and their default deny is
    /// not taken to mean "no model calls".
    pub fn names_tool(&self, tool: &str) -> bool {
        self.rules.iter().any(|r| {
            r.tools
                .as_ref()
                .is_some_and(|t| t.iter().any(|x| x == tool))
        })
    }
}

#[derive(Debug, Clone)]
pub(crate) struct CompiledRule {
    pub id: String,
    pub effect: Effect,
    pub tools: Option<Vec<String>>,
    pub args: Vec<CompiledCond>,
    pub cost: Option<(Op, i64)>,
    pub hosts: Option<Vec<HostPattern>>,
    pub ports: Option<Vec<(u16, u16)>>,
    pub credential: Option<credential::Credential>,
    /// A `require_approval` rule's hold limit (always set on one).
    pub approval_timeout: Option<std::time::Duration>,
}

#[derive(Debug, Clone)]
pub(crate) struct CompiledCond {
    pub path: Vec<String>,
    pub op: Op,
    pub operand: Operand,
}

#[derive(Debug, Clone)]
pub(crate) enum Operand {
    None,
    Value(Value),
    Ctx(String),
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum HostPattern {
    /// Lower-case name, no trailing dot.
    Exact(String),
    /// `*.suffix`: stored as `.suffix`.
    Below(String),
    Cidr(IpAddr, u8),
}

impl Policy {
    pub fn compile(doc: &PolicyDocument) -> Result<Policy, ValidationError> {
        if doc.name.trim().is_empty() || doc.name.len() > MAX_NAME_BYTES {
            return Err(ValidationError::Policy(format!(
                "name must be 1–{MAX_NAME_BYTES} bytes"
            )));
        }
        if doc
            .description
            .as_ref()
            .is_some_and(|d| d.len() > MAX_DESCRIPTION_BYTES)
        {
            return Err(ValidationError::Policy(format!(
                "description over {MAX_DESCRIPTION_BYTES} bytes"
            )));
        }
        if doc.rules.len() > MAX_RULES {
            return Err(ValidationError::Policy(format!(
                "{} rules; at most {MAX_RULES}",
                doc.rules.len()
            )));
        }
        let mut seen = HashSet::new();
        let mut rules = Vec::with_capacity(doc.rules.len());
        for (index, rule) in doc.rules.iter().enumerate() {
            let err = |message: String| ValidationError::Rule {
                index,
                id: rule.id.clone(),
                message,
            };
            if !valid_id(&rule.id) {
                return Err(err("id must be 1–64 characters of [a-z0-9_.-]".into()));
            }
            if !seen.insert(rule.id.as_str()) {
                return Err(err("duplicate rule id".into()));
            }
            rules.push(compile_rule(rule).map_err(err)?);
        }
        Ok(Policy { rules })
    }

    pub fn rule_count(&self) -> usize {
        self.rules.len()
    }

    /// How long a connection the rule at `rule_index` holds for an
    /// approval (`None` unless that rule is `require_approval`).
    pub fn approval_timeout(&self, rule_index: usize) -> Option<std::time::Duration> {
        self.rules.get(rule_index)?.approval_timeout
    }
}

fn valid_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_.-".contains(&b))
}

fn compile_rule(rule: &Rule) -> Result<CompiledRule, String> {
    if rule
        .description
        .as_ref()
        .is_some_and(|d| d.len() > MAX_DESCRIPTION_BYTES)
    {
        return Err(format!("description over {MAX_DESCRIPTION_BYTES} bytes"));
    }
    let m = &rule.matcher;
    let tools = match &m.tools {
        None => None,
        Some(t) => {
            if t.is_empty() {
                return Err(
                    "match.tools is empty (it would match nothing); omit it to match every tool"
                        .into(),
                );
            }
            if t.len() > MAX_PATTERNS_PER_RULE {
                return Err(format!(
                    "match.tools: at most {MAX_PATTERNS_PER_RULE} patterns"
                ));
            }
            for p in t {
                if p.is_empty() || p.len() > MAX_STRING_BYTES {
                    return Err(format!(
                        "match.tools: pattern must be 1–{MAX_STRING_BYTES} bytes"
                    ));
                }
            }
            Some(t.clone())
        }
    };
    if m.args.len() > MAX_CONDITIONS_PER_RULE {
        return Err(format!(
            "match.args: at most {MAX_CONDITIONS_PER_RULE} conditions"
        ));
    }
    let args = m
        .args
        .iter()
        .enumerate()
        .map(|(i, c)| compile_cond(c).map_err(|e| format!("match.args[{i}] ({:?}): {e}", c.field)))
        .collect::<Result<Vec<_>, _>>()?;
    let cost = match &m.cost {
        None => None,
        Some(c) if matches!(c.op, Op::Eq | Op::Ne | Op::Gt | Op::Ge | Op::Lt | Op::Le) => {
            Some((c.op, c.value))
        }
        Some(c) => return Err(format!("match.cost: op {} is not a comparison", c.op)),
    };
    let hosts = match &m.hosts {
        None => None,
        Some(h) => {
            if h.is_empty() {
                return Err("match.hosts is empty (it would match nothing)".into());
            }
            if h.len() > MAX_PATTERNS_PER_RULE {
                return Err(format!(
                    "match.hosts: at most {MAX_PATTERNS_PER_RULE} patterns"
                ));
            }
            Some(
                h.iter()
                    .map(|p| parse_host_pattern(p).map_err(|e| format!("match.hosts {p:?}: {e}")))
                    .collect::<Result<Vec<_>, _>>()?,
            )
        }
    };
    let ports = match &m.ports {
        None => None,
        Some(p) => {
            if p.is_empty() {
                return Err("match.ports is empty (it would match nothing)".into());
            }
            if p.len() > MAX_PATTERNS_PER_RULE {
                return Err(format!(
                    "match.ports: at most {MAX_PATTERNS_PER_RULE} entries"
                ));
            }
            Some(
                p.iter()
                    .map(|v| parse_port(v).map_err(|e| format!("match.ports {v}: {e}")))
                    .collect::<Result<Vec<_>, _>>()?,
            )
        }
    };
    let mut compiled = CompiledRule {
        id: rule.id.clone(),
        effect: rule.effect,
        tools,
        args,
        cost,
        hosts,
        ports,
        credential: None,
        approval_timeout: approval::compile(rule)?,
    };
    compiled.credential = credential::compile(rule, &compiled)?;
    Ok(compiled)
}

fn compile_cond(c: &ArgCondition) -> Result<CompiledCond, String> {
    if c.field.is_empty() || c.field.len() > MAX_STRING_BYTES {
        return Err("field must be a non-empty dotted path".into());
    }
    let path: Vec<String> = c.field.split('.').map(str::to_string).collect();
    if path.iter().any(String::is_empty) {
        return Err("field has an empty path segment".into());
    }
    if path.len() > MAX_FIELD_DEPTH {
        return Err(format!("field is deeper than {MAX_FIELD_DEPTH} segments"));
    }
    let operand = match (&c.value, c.op) {
        (None, Op::Exists | Op::Absent) => Operand::None,
        (Some(_), Op::Exists | Op::Absent) => return Err(format!("op {} takes no value", c.op)),
        (None, op) => return Err(format!("op {op} needs a value")),
        (Some(v), op) => {
            if let Some(name) = ctx_ref(v)? {
                if matches!(op, Op::In | Op::NotIn) {
                    return Err(format!("op {op} needs an array, not a context value"));
                }
                Operand::Ctx(name)
            } else {
                check_operand(op, v)?;
                Operand::Value(v.clone())
            }
        }
    };
    Ok(CompiledCond {
        path,
        op: c.op,
        operand,
    })
}

/// `{"ctx": "name"}` refers to a context value; any other object with a
/// `ctx` key is a mistake worth reporting.
fn ctx_ref(v: &Value) -> Result<Option<String>, String> {
    let Value::Object(o) = v else { return Ok(None) };
    match o.get("ctx") {
        None => Ok(None),
        Some(Value::String(s)) if o.len() == 1 && valid_id(s) => Ok(Some(s.clone())),
        Some(_) => {
            Err(r#"a context reference is {"ctx": "<name>"} with a name of [a-z0-9_.-]"#.into())
        }
    }
}

fn check_operand(op: Op, v: &Value) -> Result<(), String> {
    if json_size(v) > MAX_STRING_BYTES * 4 {
        return Err("value is too large".into());
    }
    match op {
        Op::Gt | Op::Ge | Op::Lt | Op::Le if !v.is_number() => {
            Err(format!("op {op} needs a number value"))
        }
        Op::Glob | Op::Prefix if !v.is_string() => Err(format!("op {op} needs a string value")),
        Op::In | Op::NotIn => match v {
            Value::Array(a) if !a.is_empty() => {
                let first = std::mem::discriminant(&a[0]);
                if a.iter().any(|x| std::mem::discriminant(x) != first) {
                    Err(format!("op {op}: array elements must share one JSON type"))
                } else {
                    Ok(())
                }
            }
            _ => Err(format!("op {op} needs a non-empty array value")),
        },
        _ => Ok(()),
    }
}

fn json_size(v: &Value) -> usize {
    match v {
        Value::String(s) => s.len(),
        Value::Array(a) => a.iter().map(json_size).sum::<usize>() + a.len(),
        Value::Object(o) => o.iter().map(|(k, v)| k.len() + json_size(v)).sum(),
        _ => 8,
    }
}

pub(crate) fn parse_host_pattern(p: &str) -> Result<HostPattern, String> {
    if p.is_empty() || p.len() > 253 {
        return Err("must be 1–253 bytes".into());
    }
    if let Some((addr, len)) = p.split_once('/') {
        let ip: IpAddr = addr.parse().map_err(|_| "not an IP address before '/'")?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let len: u8 = len
            .parse()
            .ok()
            .filter(|l| *l <= max)
            .ok_or_else(|| format!("prefix length must be 0–{max}"))?;
        return Ok(HostPattern::Cidr(mask(ip, len), len));
    }
    if let Ok(ip) = p.parse::<IpAddr>() {
        let len = if ip.is_ipv4() { 32 } else { 128 };
        return Ok(HostPattern::Cidr(ip, len));
    }
    let (below, name) = match p.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, p),
    };
    if !valid_hostname(name) {
        return Err("not a host name (lower-case ASCII labels of [a-z0-9-], no trailing dot), `*.name`, an IP or a CIDR".into());
    }
    Ok(if below {
        HostPattern::Below(format!(".{name}"))
    } else {
        HostPattern::Exact(name.to_string())
    })
}

/// ASCII only (IDNs must be written as their `xn--` form), lower case, no
/// empty labels, no trailing dot: the proxy normalises names the same way
/// before matching, so one spelling means one thing.
pub fn valid_hostname(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
        // A name made only of digits and dots would read as an IP spelling.
        && !name.bytes().all(|b| b.is_ascii_digit() || b == b'.')
}

fn parse_port(v: &Value) -> Result<(u16, u16), String> {
    match v {
        Value::Number(n) => {
            let p = n
                .as_u64()
                .filter(|p| (1..=65535).contains(p))
                .ok_or("port must be 1–65535")? as u16;
            Ok((p, p))
        }
        Value::String(s) => {
            let (lo, hi) = s.split_once('-').ok_or("a range is \"lo-hi\"")?;
            let lo: u16 = lo.parse().map_err(|_| "bad low port")?;
            let hi: u16 = hi.parse().map_err(|_| "bad high port")?;
            if lo == 0 || lo > hi {
                return Err("range must be 1 ≤ lo ≤ hi ≤ 65535".into());
            }
            Ok((lo, hi))
        }
        _ => Err("a port is a number or a \"lo-hi\" string".into()),
    }
}

pub(crate) fn mask(ip: IpAddr, len: u8) -> IpAddr {
    match ip {
        IpAddr::V4(a) => {
            let m = if len == 0 {
                0
            } else {
                u32::MAX << (32 - len as u32)
            };
            IpAddr::V4((u32::from(a) & m).into())
        }
        IpAddr::V6(a) => {
            let m = if len == 0 {
                0
            } else {
                u128::MAX << (128 - len as u32)
            };
            IpAddr::V6((u128::from(a) & m).into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(rules: Value) -> PolicyDocument {
        serde_json::from_value(serde_json::json!({"name": "t", "rules": rules})).unwrap()
    }

    fn rule_err(rules: Value) -> (usize, String, String) {
        match Policy::compile(&doc(rules)).unwrap_err() {
            ValidationError::Rule { index, id, message } => (index, id, message),
            e => panic!("not a rule error: {e}"),
        }
    }

    #[test]
    fn errors_name_the_rule() {
        let (i, id, m) = rule_err(serde_json::json!([
            {"id": "ok", "effect": "allow", "match": {"tools": ["a"]}},
            {"id": "big-diff", "effect": "deny", "match": {"args": [{"field": "diff_lines", "op": "gt", "value": "500"}]}}
        ]));
        assert_eq!((i, id.as_str()), (1, "big-diff"));
        assert!(m.contains("needs a number"), "{m}");
        let e = Policy::compile(&doc(serde_json::json!([
            {"id": "x", "effect": "allow"}, {"id": "x", "effect": "deny"}
        ])))
        .unwrap_err();
        assert_eq!(e.to_string(), "rule 1 (id \"x\"): duplicate rule id");
    }

    #[test]
    fn rejects_bad_parts() {
        for (rules, needle) in [
            (
                serde_json::json!([{"id": "Bad", "effect": "allow"}]),
                "id must be",
            ),
            (
                serde_json::json!([{"id": "h", "effect": "allow", "match": {"hosts": ["Example.COM"]}}]),
                "not a host name",
            ),
            (
                serde_json::json!([{"id": "h", "effect": "allow", "match": {"hosts": ["example.com."]}}]),
                "not a host name",
            ),
            (
                serde_json::json!([{"id": "h", "effect": "allow", "match": {"hosts": ["bücher.de"]}}]),
                "not a host name",
            ),
            (
                serde_json::json!([{"id": "h", "effect": "allow", "match": {"hosts": ["2130706433"]}}]),
                "not a host name",
            ),
            (
                serde_json::json!([{"id": "h", "effect": "allow", "match": {"hosts": ["10.0.0.0/33"]}}]),
                "prefix length",
            ),
            (
                serde_json::json!([{"id": "h", "effect": "allow", "match": {"hosts": []}}]),
                "empty",
            ),
            (
                serde_json::json!([{"id": "p", "effect": "allow", "match": {"ports": [0]}}]),
                "1–65535",
            ),
            (
                serde_json::json!([{"id": "p", "effect": "allow", "match": {"ports": ["90-80"]}}]),
                "lo ≤ hi",
            ),
            (
                serde_json::json!([{"id": "a", "effect": "allow", "match": {"args": [{"field": "x", "op": "exists", "value": 1}]}}]),
                "takes no value",
            ),
            (
                serde_json::json!([{"id": "a", "effect": "allow", "match": {"args": [{"field": "x", "op": "eq"}]}}]),
                "needs a value",
            ),
            (
                serde_json::json!([{"id": "a", "effect": "allow", "match": {"args": [{"field": "x..y", "op": "exists"}]}}]),
                "empty path",
            ),
            (
                serde_json::json!([{"id": "a", "effect": "allow", "match": {"args": [{"field": "x", "op": "in", "value": [1, "a"]}]}}]),
                "one JSON type",
            ),
            (
                serde_json::json!([{"id": "a", "effect": "allow", "match": {"args": [{"field": "x", "op": "eq", "value": {"ctx": 3}}]}}]),
                "context reference",
            ),
            (
                serde_json::json!([{"id": "c", "effect": "allow", "match": {"cost": {"op": "glob", "value": 3}}}]),
                "not a comparison",
            ),
        ] {
            let (_, _, m) = rule_err(rules.clone());
            assert!(m.contains(needle), "{rules}: {m}");
        }
    }

    #[test]
    fn caps_at_the_boundary() {
        let rules: Vec<Value> = (0..MAX_RULES)
            .map(|i| serde_json::json!({"id": format!("r{i}"), "effect": "deny"}))
            .collect();
        assert_eq!(
            Policy::compile(&doc(Value::Array(rules.clone())))
                .unwrap()
                .rule_count(),
            MAX_RULES
        );
        let mut more = rules;
        more.push(serde_json::json!({"id": "extra", "effect": "deny"}));
        assert!(matches!(
            Policy::compile(&doc(Value::Array(more))),
            Err(ValidationError::Policy(_))
        ));
        let conds: Vec<Value> = (0..=MAX_CONDITIONS_PER_RULE)
            .map(|i| serde_json::json!({"field": format!("f{i}"), "op": "exists"}))
            .collect();
        let (_, _, m) =
            rule_err(serde_json::json!([{"id": "a", "effect": "allow", "match": {"args": conds}}]));
        assert!(m.contains("at most"), "{m}");
    }

    #[test]
    fn unknown_fields_are_refused() {
        let r: Result<PolicyDocument, _> = serde_json::from_value(serde_json::json!({
            "name": "t", "rules": [{"id": "a", "effect": "allow", "match": {"tool": "x"}}]
        }));
        assert!(r.unwrap_err().to_string().contains("unknown field"));
    }
}
