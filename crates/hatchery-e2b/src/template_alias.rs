//! E2B's names for Hatchery templates, resolved wherever a client names a
//! template: a create, a list filter, `Template.exists`, and a snapshot
//! name (which must not be a template's).

/// E2B template names that stand for a Hatchery one.
pub fn template_alias(name: &str) -> &str {
    match name {
        "code-interpreter-v1" | "code-interpreter-beta" => "code-interpreter",
        other => other,
    }
}
