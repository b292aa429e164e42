//! The policy document: what callers write and the store keeps, as JSON.
//! It is only data; [`crate::compile`] checks it and turns it into the form
//! the evaluator runs.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A policy: ordered rules, the first that matches decides; a request no
/// rule matches is denied.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyDocument {
    /// A label for people; not unique.
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Tried in order; the first whose `match` holds decides.
    pub rules: Vec<Rule>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Unique within the policy: `[a-z0-9_.-]`, 1–64 characters. Decisions
    /// and validation errors name it.
    pub id: String,
    /// Every field present must hold; an empty match holds for everything.
    #[serde(default, rename = "match")]
    pub matcher: Match,
    pub effect: Effect,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// A stored secret the egress proxy adds to matching HTTPS requests to
    /// this rule's hosts (docs/policy.md, "Credentials"). Only on an
    /// `allow` rule of the `egress` tool with named hosts and ports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<crate::binding::CredentialBinding>,
    /// How long the egress proxy holds a connection this `require_approval`
    /// rule decides while it waits for a person's decision, in seconds:
    /// 1–900, absent 120 (`compile::approval`). Only on a
    /// `require_approval` rule (docs/sessions.md, "Egress").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_timeout_s: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    Allow,
    Deny,
    RequireApproval,
}

/// What a rule applies to. Absent fields match anything.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Match {
    /// Tool name globs (`*` any run of characters, `?` one); one must match.
    /// The egress proxy asks with the tool name `egress`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    /// Conditions on the call's JSON arguments; all must hold.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<ArgCondition>,
    /// A comparison on the call's estimated cost, in cents. A request without
    /// an estimate does not match a rule that has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<NumberCondition>,
    /// Destination host patterns; one must match. `example.com` exactly,
    /// `*.example.com` any name below it (not itself), an IP literal, or a
    /// CIDR range such as `10.1.0.0/16` (matched against the resolved
    /// address). A request without a destination does not match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosts: Option<Vec<String>>,
    /// Destination ports: numbers or `"lo-hi"` ranges; one must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    pub ports: Option<Vec<serde_json::Value>>,
}

/// `field` is a dotted path into the arguments (`repo.branch`); array
/// elements by index (`files.0`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ArgCondition {
    pub field: String,
    pub op: Op,
    /// The operand: a JSON value, or `{"ctx": "name"}` for a value from the
    /// request's context (e.g. `session_branch`). Not used by `exists` and
    /// `absent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub value: Option<serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NumberCondition {
    pub op: Op,
    pub value: i64,
}

/// Comparison operators. `eq`/`ne` compare JSON values exactly (numbers by
/// value); `gt`..`le` need numbers; `glob` and `prefix` strings; `in` and
/// `not_in` an array operand. Every operator but `absent` needs the field to
/// be present and of the operand's JSON type: `branch ne "main"` does not
/// hold for `"branch": ["main"]`, so an allow rule cannot be satisfied by
/// sending a value of an unexpected type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Eq,
    Ne,
    Gt,
    Ge,
    Lt,
    Le,
    Glob,
    Prefix,
    In,
    NotIn,
    Exists,
    Absent,
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The document's spelling, so errors quote what the caller wrote.
        f.write_str(match self {
            Op::Eq => "eq",
            Op::Ne => "ne",
            Op::Gt => "gt",
            Op::Ge => "ge",
            Op::Lt => "lt",
            Op::Le => "le",
            Op::Glob => "glob",
            Op::Prefix => "prefix",
            Op::In => "in",
            Op::NotIn => "not_in",
            Op::Exists => "exists",
            Op::Absent => "absent",
        })
    }
}

/// The tool name the egress proxy evaluates connections under.
pub const EGRESS_TOOL: &str = "egress";

/// The tool name the model gateway evaluates a model call as, with the
/// call's estimated cost (issue 36). A policy none of whose rules names it
/// leaves model calls to the budget alone (`Policy::names_tool`).
pub const MODEL_CALL_TOOL: &str = "model_call";

/// The tool name a resumed session's re-run message that asks for
/// something else than before the resume is evaluated as (issue 37), with
/// arguments `n`, `kind` and `asked`. `allow` lets the re-run go on,
/// `require_approval` asks a person, `deny` (and a policy that does not
/// name it) ends the session `replay_diverged`.
pub const REPLAY_DIVERGED_TOOL: &str = "replay_diverged";
