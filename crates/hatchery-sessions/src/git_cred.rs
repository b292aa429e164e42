//! Which fetches and pushes get the operator's git credential (issue 36).
//! The credential is an HTTP header git sends to the repository's host;
//! a tenant names its own repository URL, so a tenant's fetch (session or
//! environment build) or push sends it only to a host the operator listed
//! (`--sessions-git-credential-host`, `--broker-git-credential-host`).
//! The operator's own sessions send it wherever they fetch, as before.
//! Here rather than in repo.rs so that the broker (hatchery-broker) uses
//! the same rule for its pushes.

/// Whether a fetch or push of `url` for a session (or environment) of
/// `tenant` (`None`: the operator's) may carry the operator's credential.
/// An entry of `hosts` is `host` (any port) or `host:port`; names compare
/// without case. A URL without an authority git could send a header to
/// (`file://`, anything unparsable) is never allowed for a tenant.
pub fn allowed(url: &str, tenant: Option<&str>, hosts: &[String]) -> bool {
    if tenant.is_none() {
        return true;
    }
    let Some((host, port)) = host_port(url) else {
        return false;
    };
    hosts.iter().any(|entry| match split_port(entry) {
        (h, Some(p)) => h.eq_ignore_ascii_case(host) && p == port,
        (h, None) => h.eq_ignore_ascii_case(host),
    })
}

/// The host and port (the scheme's default when absent) of an `https://`,
/// `http://` or `git://` URL.
fn host_port(url: &str) -> Option<(&str, u16)> {
    let (scheme, rest) = url.split_once("://")?;
    let default = match scheme {
        "https" => 443,
        "http" => 80,
        "git" => 9418,
        _ => return None,
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    // userinfo is refused by the URL check; never match past it anyway.
    if authority.is_empty() || authority.contains('@') {
        return None;
    }
    match split_port(authority) {
        (h, Some(p)) => Some((h, p)),
        // No port, or one that is not a port (then no match at all).
        (h, None) if h.starts_with('[') && h.ends_with(']') => Some((h, default)),
        (h, None) if !h.contains(':') => Some((h, default)),
        _ => None,
    }
}

/// `host:port` split at a valid port; IPv6 literals stay in brackets.
fn split_port(s: &str) -> (&str, Option<u16>) {
    if let Some((h, p)) = s.rsplit_once(':') {
        if !h.is_empty() && (!h.contains(':') || h.ends_with(']')) {
            if let Ok(p) = p.parse::<u16>() {
                return (h, Some(p));
            }
        }
    }
    (s, None)
}

#[cfg(test)]
mod tests {
    use super::allowed;

    fn hosts(h: &[&str]) -> Vec<String> {
        h.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_operator_always_and_a_tenant_only_to_a_listed_host() {
        let list = hosts(&["github.com", "git.corp:8443", "[::1]:9443"]);
        let t = Some("ten_a");
        for url in [
            "https://evil.example/r.git",
            "file:///srv/r",
            "git://evil/r",
        ] {
            assert!(allowed(url, None, &list), "{url}");
            assert!(!allowed(url, t, &list), "{url}");
        }
        for (url, want) in [
            ("https://github.com/o/r.git", true),
            ("https://GitHub.com:443/o/r.git", true),
            ("https://github.com.evil.example/o/r.git", false),
            ("https://evil.example/github.com/r.git", false),
            ("https://git.corp:8443/r.git", true),
            ("https://git.corp/r.git", false),
            ("https://git.corp:9443/r.git", false),
            ("https://[::1]:9443/r.git", true),
            ("https://[::1]/r.git", false),
            ("https://x@github.com/r.git", false),
            ("https://github.com:bad/r.git", false),
            ("ftp://github.com/r.git", false),
        ] {
            assert_eq!(allowed(url, t, &list), want, "{url}");
        }
        assert!(
            !allowed("https://github.com/r.git", t, &[]),
            "no list: nothing"
        );
    }
}
