//! Two origins per daemon: the API's (the `/v1` API, the rounds pages,
//! the terminal) and the preview origin (a listener of its own, or a
//! wildcard host), which alone serves what guest servers answer.
//!
//! A browser gives every page of an origin the same powers: a page that
//! registers a service worker there answers every later request of that
//! origin, reads the tokens in the fragments of the pages it serves, and
//! can script any other page of the origin. So no guest content may ever
//! be served on the origin of Hatchery's own pages (threat-model.md,
//! "Security review findings (issue 31)"). This module says which
//! requests ask for guest content ([`is_guest_content`]), where the
//! preview origin is ([`PreviewOrigin`]), and what Hatchery's own pages
//! send ([`page_headers`]).

use axum::http::{header, HeaderMap, HeaderValue};

/// E2B's envd and code interpreter ports: Hatchery answers these itself
/// (hatchery-e2b), so they are API traffic; every other E2B port is
/// relayed to a guest server. The same numbers as `hatchery_e2b::sandbox`.
pub const E2B_ENVD_PORT: u16 = 49983;
pub const E2B_INTERPRETER_PORT: u16 = 49999;

/// Whether a request asks for what a guest server answers: a preview URL
/// (`/preview/...`) or E2B sandbox traffic (`/e2b/sandbox...`) to a port
/// other than envd's and the interpreter's. A malformed
/// `E2b-Sandbox-Port` is not: the E2B router answers it 400 anywhere.
pub fn is_guest_content(path: &str, h: &HeaderMap) -> bool {
    if path == "/preview" || path.starts_with("/preview/") {
        return true;
    }
    if path == "/e2b/sandbox" || path.starts_with("/e2b/sandbox/") {
        let port = h
            .get("e2b-sandbox-port")
            .and_then(|v| v.to_str().ok())
            .and_then(|p| p.parse::<u16>().ok());
        return matches!(port, Some(p) if p != 0 && p != E2B_ENVD_PORT && p != E2B_INTERPRETER_PORT);
    }
    false
}

/// Where previews are served, as a base URL for the ones handed out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreviewOrigin {
    /// `--preview-url`, without a trailing slash: `scheme://host[:port]`,
    /// or with `*` as its host's first label (`https://*.preview.example`),
    /// which gives every sandbox port an origin of its own.
    pub public: Option<String>,
    /// The preview listener's port, for URLs built from the host name a
    /// client reached the API at.
    pub port: u16,
}

impl PreviewOrigin {
    pub fn new(public: Option<&str>, port: u16) -> Self {
        PreviewOrigin {
            public: public.map(|p| p.trim_end_matches('/').to_string()),
            port,
        }
    }

    /// Whether `--preview-url` names a wildcard host.
    pub fn is_wildcard(&self) -> bool {
        self.wildcard_host().is_some()
    }

    /// `*.preview.example` of `https://*.preview.example:8443`.
    fn wildcard_host(&self) -> Option<&str> {
        let p = self.public.as_deref()?;
        let host = p.split_once("://").map_or(p, |(_, rest)| rest);
        host.starts_with("*.").then(|| strip_port(host))
    }

    /// The base URL (no trailing slash) of the preview of `port` of
    /// `sandbox` for a client that reached the API with `Host: host`:
    /// `--preview-url` (its `*` replaced by [`label`]), else `http://` +
    /// the host name of `host` + the preview listener's port. `None`
    /// without either: the caller hands out a path only.
    pub fn base(&self, host: Option<&str>, sandbox: &str, port: u16) -> Option<String> {
        if let Some(p) = &self.public {
            return Some(p.replacen('*', &label(sandbox, port), 1));
        }
        let name = strip_port(host?);
        (!name.is_empty()).then(|| format!("http://{name}:{}", self.port))
    }

    /// With a wildcard `--preview-url`, whether a request for the preview
    /// of `port` of `sandbox` came to that preview's own host name; a
    /// token opened under another preview's host would share that
    /// preview's origin. Always true without a wildcard.
    pub fn host_matches(&self, host: Option<&str>, sandbox: &str, port: u16) -> bool {
        let Some(w) = self.wildcard_host() else {
            return true;
        };
        let want = w.replacen('*', &label(sandbox, port), 1);
        host.is_some_and(|h| strip_port(h).eq_ignore_ascii_case(&want))
    }
}

/// The first host label of a preview under a wildcard `--preview-url`:
/// `PORT-ID` as E2B's hosts are, without `sbx_` (underscores are not
/// valid in host names; sandbox ids are lowercase letters and digits).
pub fn label(sandbox: &str, port: u16) -> String {
    let id = sandbox.strip_prefix("sbx_").unwrap_or(sandbox);
    format!("{port}-{}", id.replace('_', "-").to_ascii_lowercase())
}

/// `name` of `name:port`, `[v6]` of `[v6]:port`.
fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host.find(']').map_or(host, |i| &host[..=i]);
    }
    host.rsplit_once(':').map_or(host, |(name, _)| name)
}

/// What Hatchery's own pages (rounds, terminal) are sent with, beside
/// their CSP (which must say `frame-ancestors 'none'`): no other origin
/// keeps a handle on their window (a page that opened them cannot script
/// or navigate them), no framing, no MIME sniffing, no referrer (tokens
/// live in fragments; even the path stays here). No `Clear-Site-Data`: it
/// would wipe state a reviewer keeps in other tabs.
pub fn page_headers(h: &mut HeaderMap, csp: &'static str) {
    debug_assert!(csp.contains("frame-ancestors 'none'"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(csp),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        "cross-origin-opener-policy",
        HeaderValue::from_static("same-origin"),
    );
    h.insert(
        "cross-origin-resource-policy",
        HeaderValue::from_static("same-origin"),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(p: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("e2b-sandbox-port", HeaderValue::from_static(p));
        h
    }

    #[test]
    fn guest_content_is_previews_and_relayed_e2b_ports() {
        let none = HeaderMap::new();
        assert!(is_guest_content("/preview/tok/", &none));
        assert!(is_guest_content("/preview/tok", &none));
        assert!(is_guest_content("/preview", &none));
        assert!(!is_guest_content("/previews", &none));
        assert!(!is_guest_content("/v1/sandboxes/sbx_a/ports/8000/", &none));
        assert!(!is_guest_content("/rounds/review/", &none));
        assert!(!is_guest_content("/terminal/", &none));
        // E2B: envd (also when no port is named) and the interpreter are
        // the daemon's own; any other port is a guest server.
        assert!(!is_guest_content("/e2b/sandbox/files", &none));
        assert!(!is_guest_content("/e2b/sandbox/files", &port("49983")));
        assert!(!is_guest_content("/e2b/sandbox/execute", &port("49999")));
        assert!(is_guest_content("/e2b/sandbox/", &port("8000")));
        assert!(is_guest_content("/e2b/sandbox", &port("3000")));
        assert!(!is_guest_content("/e2b/sandboxes", &port("8000")));
        for bad in ["0", "x", "65536", ""] {
            assert!(!is_guest_content("/e2b/sandbox/", &port(bad)), "{bad}");
        }
    }

    #[test]
    fn preview_bases() {
        let o = PreviewOrigin::new(None, 7424);
        assert_eq!(
            o.base(Some("127.0.0.1:7423"), "sbx_a", 80).as_deref(),
            Some("http://127.0.0.1:7424")
        );
        assert_eq!(
            o.base(Some("box.internal"), "sbx_a", 80).as_deref(),
            Some("http://box.internal:7424")
        );
        assert_eq!(
            o.base(Some("[::1]:7423"), "sbx_a", 80).as_deref(),
            Some("http://[::1]:7424")
        );
        assert_eq!(o.base(None, "sbx_a", 80), None);
        assert!(!o.is_wildcard());
        assert!(o.host_matches(None, "sbx_a", 80));

        let o = PreviewOrigin::new(Some("https://previews.example/"), 7424);
        assert_eq!(
            o.base(Some("api.example"), "sbx_a", 80).as_deref(),
            Some("https://previews.example")
        );
        assert!(o.host_matches(Some("anything"), "sbx_a", 80));
    }

    #[test]
    fn a_wildcard_gives_each_preview_its_own_host_and_checks_it() {
        let o = PreviewOrigin::new(Some("http://*.preview.test:7424"), 1);
        assert!(o.is_wildcard());
        let id = "sbx_abcdefghij012345";
        assert_eq!(label(id, 8000), "8000-abcdefghij012345");
        assert_eq!(
            o.base(None, id, 8000).as_deref(),
            Some("http://8000-abcdefghij012345.preview.test:7424")
        );
        assert!(o.host_matches(Some("8000-abcdefghij012345.preview.test:7424"), id, 8000));
        assert!(o.host_matches(Some("8000-ABCDEFGHIJ012345.preview.test"), id, 8000));
        // Another port or sandbox of the same wildcard, the bare domain,
        // or no Host at all: not this preview's origin.
        for h in [
            Some("8001-abcdefghij012345.preview.test:7424"),
            Some("8000-zzzzzzzzzz012345.preview.test:7424"),
            Some("preview.test:7424"),
            Some("8000-abcdefghij012345.preview.test.evil:7424"),
            None,
        ] {
            assert!(!o.host_matches(h, id, 8000), "{h:?}");
        }
    }

    #[test]
    fn pages_get_their_isolation_headers() {
        let mut h = HeaderMap::new();
        page_headers(&mut h, "default-src 'self'; frame-ancestors 'none'");
        assert_eq!(h["cross-origin-opener-policy"], "same-origin");
        assert_eq!(h["x-content-type-options"], "nosniff");
        assert_eq!(h["x-frame-options"], "DENY");
        assert!(h["content-security-policy"]
            .to_str()
            .unwrap()
            .contains("frame-ancestors 'none'"));
        assert!(!h.contains_key("clear-site-data"));
    }
}
