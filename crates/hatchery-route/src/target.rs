//! Which requests are scoped to one sandbox or snapshot.

/// What a request path is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope<'a> {
    Sandbox(&'a str),
    Snapshot(&'a str),
    /// An agent session: its runner is on the host that owns it, so its
    /// messages, cancels and approvals must reach that host.
    Session(&'a str),
    /// A list, a create, templates, meta: no single owner.
    Other,
}

/// `/v1/sandboxes/{id}[/...]` and `/v1/snapshots/{id}[/...]`. An empty or
/// oversized id is [`Scope::Other`]: the local handler refuses it.
pub fn scope_of(path: &str) -> Scope<'_> {
    let seg = |rest: &'static str| {
        path.strip_prefix(rest)
            .map(|r| r.split('/').next().unwrap_or(""))
            .filter(|id| !id.is_empty() && id.len() <= 128)
    };
    if let Some(id) = seg("/v1/sandboxes/") {
        return Scope::Sandbox(id);
    }
    if let Some(id) = seg("/v1/snapshots/") {
        return Scope::Snapshot(id);
    }
    // `/v1/sessions/{id}:cancel` too: the id ends at a `:` as well.
    if let Some(id) = seg("/v1/sessions/").map(|s| s.split(':').next().unwrap_or("")) {
        if !id.is_empty() {
            return Scope::Session(id);
        }
    }
    Scope::Other
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes() {
        assert_eq!(scope_of("/v1/sandboxes/sb1"), Scope::Sandbox("sb1"));
        assert_eq!(scope_of("/v1/sandboxes/sb1/exec"), Scope::Sandbox("sb1"));
        assert_eq!(
            scope_of("/v1/sandboxes/sb1/ports/80/a/b"),
            Scope::Sandbox("sb1")
        );
        assert_eq!(scope_of("/v1/snapshots/sn1/fork"), Scope::Snapshot("sn1"));
        assert_eq!(scope_of("/v1/sandboxes"), Scope::Other);
        assert_eq!(scope_of("/v1/sandboxes/"), Scope::Other);
        assert_eq!(scope_of("/v1/snapshots"), Scope::Other);
        assert_eq!(scope_of("/v1/sessions/ses_1"), Scope::Session("ses_1"));
        assert_eq!(
            scope_of("/v1/sessions/ses_1:cancel"),
            Scope::Session("ses_1")
        );
        assert_eq!(
            scope_of("/v1/sessions/ses_1/messages"),
            Scope::Session("ses_1")
        );
        assert_eq!(scope_of("/v1/sessions"), Scope::Other);
        assert_eq!(scope_of("/v1/sessions/:cancel"), Scope::Other);
        assert_eq!(scope_of("/v1/templates/x"), Scope::Other);
        assert_eq!(
            scope_of(&format!("/v1/sandboxes/{}", "a".repeat(129))),
            Scope::Other
        );
    }
}
