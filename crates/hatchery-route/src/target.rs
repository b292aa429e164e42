//! Which requests are scoped to one sandbox, snapshot or session.

use axum::http::HeaderMap;

/// What a request is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    Sandbox(String),
    Snapshot(String),
    /// An agent session: its runner is on the host that owns it, so its
    /// messages, cancels and approvals must reach that host.
    Session(String),
    /// A list, a create, templates, meta: no single owner.
    Other,
}

/// Longest id taken from a path or header; longer is [`Scope::Other`] and
/// the local handler refuses it.
const MAX_ID: usize = 128;

/// `/v1/sandboxes/{id}[/...]`, `/v1/snapshots/{id}[/...]` and
/// `/v1/sessions/{id}[...]`. An empty or oversized id is [`Scope::Other`].
pub fn scope_of(path: &str) -> Scope {
    scope_of_request(path, &HeaderMap::new())
}

/// [`scope_of`], plus the requests that name their sandbox elsewhere:
/// E2B's control plane (`/e2b/sandboxes/{id}`, `/e2b/v2/sandboxes/{id}`),
/// E2B's sandbox traffic (`/e2b/sandbox/...` with `E2b-Sandbox-Id`), and
/// preview URLs (`/preview/{token}/...`, whose token carries the sandbox
/// id; only its owner can verify it, which it does).
pub fn scope_of_request(path: &str, headers: &HeaderMap) -> Scope {
    let seg = |rest: &'static str| {
        path.strip_prefix(rest)
            .map(|r| r.split('/').next().unwrap_or(""))
            .filter(|id| !id.is_empty() && id.len() <= MAX_ID)
    };
    let sandbox = |id: &str| Scope::Sandbox(id.to_string());
    if let Some(id) = seg("/v1/sandboxes/") {
        return sandbox(id);
    }
    if let Some(id) = seg("/v1/snapshots/") {
        return Scope::Snapshot(id.into());
    }
    // `/v1/sessions/{id}:cancel` too: the id ends at a `:` as well.
    if let Some(id) = seg("/v1/sessions/").map(|s| s.split(':').next().unwrap_or("")) {
        if !id.is_empty() {
            return Scope::Session(id.into());
        }
    }
    if let Some(id) = seg("/e2b/sandboxes/").or_else(|| seg("/e2b/v2/sandboxes/")) {
        return sandbox(id);
    }
    if path == "/e2b/sandbox" || path.starts_with("/e2b/sandbox/") {
        return match headers.get("e2b-sandbox-id").and_then(|v| v.to_str().ok()) {
            Some(id) if !id.is_empty() && id.len() <= MAX_ID => sandbox(id),
            _ => Scope::Other,
        };
    }
    if let Some(id) = seg("/preview/").and_then(preview_sandbox) {
        return Scope::Sandbox(id);
    }
    Scope::Other
}

/// The sandbox id a preview token names, unverified (its owner verifies).
fn preview_sandbox(token: &str) -> Option<String> {
    hatchery_serve::preview_token::sandbox_unverified(token).filter(|id| id.len() <= MAX_ID)
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;

    #[test]
    fn scopes() {
        let sb = |id: &str| Scope::Sandbox(id.into());
        assert_eq!(scope_of("/v1/sandboxes/sb1"), sb("sb1"));
        assert_eq!(scope_of("/v1/sandboxes/sb1/exec"), sb("sb1"));
        assert_eq!(scope_of("/v1/sandboxes/sb1/ports/80/a/b"), sb("sb1"));
        assert_eq!(
            scope_of("/v1/snapshots/sn1/fork"),
            Scope::Snapshot("sn1".into())
        );
        assert_eq!(scope_of("/v1/sandboxes"), Scope::Other);
        assert_eq!(scope_of("/v1/sandboxes/"), Scope::Other);
        assert_eq!(scope_of("/v1/snapshots"), Scope::Other);
        assert_eq!(
            scope_of("/v1/sessions/ses_1"),
            Scope::Session("ses_1".into())
        );
        assert_eq!(
            scope_of("/v1/sessions/ses_1:cancel"),
            Scope::Session("ses_1".into())
        );
        assert_eq!(
            scope_of("/v1/sessions/ses_1/messages"),
            Scope::Session("ses_1".into())
        );
        assert_eq!(scope_of("/v1/sessions"), Scope::Other);
        assert_eq!(scope_of("/v1/sessions/:cancel"), Scope::Other);
        assert_eq!(scope_of("/v1/templates/x"), Scope::Other);
        assert_eq!(
            scope_of(&format!("/v1/sandboxes/{}", "a".repeat(129))),
            Scope::Other
        );
    }

    #[test]
    fn e2b_and_preview_requests_name_their_sandbox() {
        use axum::http::HeaderValue;
        let sb = |id: &str| Scope::Sandbox(id.into());
        let none = HeaderMap::new();
        assert_eq!(scope_of("/e2b/sandboxes/sbx_1"), sb("sbx_1"));
        assert_eq!(scope_of("/e2b/sandboxes/sbx_1/timeout"), sb("sbx_1"));
        assert_eq!(scope_of("/e2b/v2/sandboxes/sbx_1/connect"), sb("sbx_1"));
        assert_eq!(scope_of("/e2b/sandboxes"), Scope::Other);
        let mut h = HeaderMap::new();
        h.insert("e2b-sandbox-id", HeaderValue::from_static("sbx_2"));
        assert_eq!(scope_of_request("/e2b/sandbox/files", &h), sb("sbx_2"));
        assert_eq!(scope_of_request("/e2b/sandbox/files", &none), Scope::Other);
        assert_eq!(scope_of_request("/e2b/sandboxes", &h), Scope::Other);
        // A token as hatchery-core mints it (the MAC is not checked here).
        let mut blob = vec![1u8, 0x1f, 0x90];
        blob.extend_from_slice(&u64::MAX.to_be_bytes());
        blob.extend_from_slice(b"sbx_3");
        blob.extend_from_slice(&[7u8; 32]);
        let tok = URL_SAFE_NO_PAD.encode(&blob);
        assert_eq!(scope_of(&format!("/preview/{tok}/index.html")), sb("sbx_3"));
        assert_eq!(scope_of("/preview/not-base64!/x"), Scope::Other);
        blob[0] = 2;
        let tok = URL_SAFE_NO_PAD.encode(&blob);
        assert_eq!(scope_of(&format!("/preview/{tok}/")), Scope::Other);
    }
}
