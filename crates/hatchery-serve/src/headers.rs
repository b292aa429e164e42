//! HTTP helpers every Hatchery proxy and key check needs: which headers
//! belong to one connection (and so never travel through a proxy), whether
//! a request asks to upgrade, and a comparison of secrets that does not
//! stop at the first differing byte.

use axum::http::header::{self, HeaderMap, HeaderName};

/// The comma-separated tokens of a header, trimmed and in lower case.
pub fn tokens(h: &HeaderMap, name: HeaderName) -> impl Iterator<Item = String> + '_ {
    h.get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| !t.is_empty())
}

/// Whether the request asks to switch protocols (a WebSocket).
pub fn is_upgrade(h: &HeaderMap) -> bool {
    h.contains_key(header::UPGRADE) && tokens(h, header::CONNECTION).any(|t| t == "upgrade")
}

/// Removes the headers that describe one connection (RFC 9110 7.6.1),
/// including any the `Connection` header names.
pub fn strip_hop_by_hop(h: &mut HeaderMap) {
    let named: Vec<HeaderName> = tokens(h, header::CONNECTION)
        .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
        .collect();
    for n in named {
        h.remove(n);
    }
    for n in [
        header::CONNECTION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
    ] {
        h.remove(n);
    }
    h.remove("keep-alive");
    h.remove("proxy-connection");
}

/// Equal secrets, compared in time that depends only on the length.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The daemon's API key, as `Authorization: Bearer KEY` or E2B's
/// `X-API-Key: KEY` (or `e2b_` + its hex, for clients that insist on E2B's
/// key shape), compared in constant time.
pub fn api_key_ok(h: &HeaderMap, key: &str) -> bool {
    let given = h
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .or_else(|| {
            h.get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
        });
    let Some(given) = given else { return false };
    let alt = key.strip_prefix("hx_").map(|hex| format!("e2b_{hex}"));
    constant_time_eq(given.as_bytes(), key.as_bytes())
        || alt.is_some_and(|a| constant_time_eq(given.as_bytes(), a.as_bytes()))
}

/// The header daemons of one deployment prove themselves to each other
/// with: a secret kept in the shared database (the "daemon key"), which
/// clients never hold, unlike the API key every client of the deployment
/// has. Routes only daemons may call (a session's model events, the
/// control role's model gateway) want it beside the API key.
pub const DAEMON_KEY_HEADER: &str = "x-hatchery-daemon-key";

/// The sandbox a request from a guest came from. The daemon's host-service
/// relay sets it on every request it carries out of a sandbox (replacing
/// any the guest sent), so guest code cannot choose it; the gateway, the
/// broker and the relays to the control role read it.
pub const SANDBOX_HEADER: &str = "x-hatchery-sandbox";

/// Whether the request carries the deployment's daemon key, compared in
/// constant time. An empty key (none loaded) matches nothing.
pub fn daemon_key_ok(h: &HeaderMap, key: &str) -> bool {
    let given = h.get(DAEMON_KEY_HEADER).and_then(|v| v.to_str().ok());
    !key.is_empty() && given.is_some_and(|g| constant_time_eq(g.as_bytes(), key.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(name: &str, v: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_static(v),
        );
        h
    }

    #[test]
    fn the_key_as_bearer_or_x_api_key() {
        assert!(api_key_ok(
            &with("authorization", "Bearer hx_ab12"),
            "hx_ab12"
        ));
        assert!(api_key_ok(&with("x-api-key", "hx_ab12"), "hx_ab12"));
        assert!(api_key_ok(&with("x-api-key", "e2b_ab12"), "hx_ab12"));
        assert!(!api_key_ok(&with("x-api-key", "e2b_ab13"), "hx_ab12"));
        assert!(!api_key_ok(
            &with("authorization", "Basic hx_ab12"),
            "hx_ab12"
        ));
        assert!(!api_key_ok(&HeaderMap::new(), "hx_ab12"));
    }
    use axum::http::HeaderValue;

    #[test]
    fn hop_by_hop_headers_go_and_named_ones_too() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, X-Secret"),
        );
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key(header::CONTENT_TYPE));
    }

    #[test]
    fn upgrade_needs_both_headers() {
        let mut h = HeaderMap::new();
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        assert!(!is_upgrade(&h));
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, Upgrade"),
        );
        assert!(is_upgrade(&h));
    }

    #[test]
    fn secrets() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }

    #[test]
    fn the_daemon_key_only_in_its_own_header() {
        assert!(daemon_key_ok(&with(DAEMON_KEY_HEADER, "dk_1"), "dk_1"));
        assert!(!daemon_key_ok(&with(DAEMON_KEY_HEADER, "dk_2"), "dk_1"));
        assert!(!daemon_key_ok(
            &with("authorization", "Bearer dk_1"),
            "dk_1"
        ));
        assert!(!daemon_key_ok(&with(DAEMON_KEY_HEADER, ""), ""));
        assert!(!daemon_key_ok(&HeaderMap::new(), "dk_1"));
    }
}
