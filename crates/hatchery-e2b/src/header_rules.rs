//! E2B's header transforms (`network.rules`), checked at the edge into
//! typed [`HeaderRule`]s. What the SDKs send (e2b 2.63.0
//! `_build_client_rules`, e2b-dev/E2B `spec/openapi.yml`
//! `SandboxNetworkConfig.rules`):
//!
//! ```json
//! {"network": {"rules": {"api.example.com": [
//!     {"transform": {"headers": {"Authorization": "Bearer ..."}}}]}}}
//! ```
//!
//! Keys are hosts; each value an ordered list of rules whose `transform`
//! (optional) holds `headers` (optional), name to plain value, "an
//! existing header with the same name is replaced". Hatchery maps each
//! header onto a credential binding of the egress proxy (the backend's
//! business): the value is stored sealed and added at the proxy, never in
//! the sandbox. So the same refusals as `/v1/secrets` and a policy's
//! credential binding apply here, each a 400 naming the field.

use crate::api_error::{ApiError, ApiResult};
pub use crate::backend::HeaderRule;
use serde_json::Value;

/// Hosts one sandbox may name in `network.rules`.
pub const MAX_HOSTS: usize = 16;
/// Headers one sandbox's rules may set, over all hosts (each is one
/// sealed value).
pub const MAX_HEADERS: usize = 32;
/// Largest header value (as `/v1/secrets`).
pub const MAX_VALUE_BYTES: usize = 4096;
/// Longest header name (as a policy's credential binding).
pub const MAX_NAME_BYTES: usize = 64;

/// E2B's placeholder for a workload identity token (`iam`), which its
/// proxy swaps for a token it mints; Hatchery mints none.
const IAM_PLACEHOLDER: &str = "${e2b.identity.tokens.";

/// Headers the proxy writes itself (framing, hop-by-hop, the proxy's own):
/// a rule cannot set them (as a policy's credential binding cannot).
const PROXY_OWNED: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
    "keep-alive",
    "proxy-authorization",
    "proxy-connection",
];

fn bad(msg: String) -> ApiError {
    ApiError::bad(msg)
}

/// A key of `network.rules`: what a credential binding may name.
fn check_host(key: &str) -> ApiResult<String> {
    let h = key.to_ascii_lowercase();
    let why = |w: &str| bad(format!("network.rules host {key:?} {w}"));
    if h == "*" || h.is_empty() {
        return Err(why(
            "is refused: a header is added for named hosts only, never for every host",
        ));
    }
    if h.contains(':') {
        return Err(why("is IPv6: Hatchery sandboxes have IPv4 egress only"));
    }
    if h.contains('/') {
        return Err(why(
            "is an address range: name single addresses or host names",
        ));
    }
    if h.parse::<std::net::Ipv4Addr>().is_ok() {
        return Ok(h);
    }
    if h.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(why("is not a valid IPv4 address"));
    }
    let name = match h.strip_prefix("*.") {
        Some(rest) => {
            // `*.com` would send the value to a whole top-level domain.
            if !rest.contains('.') {
                return Err(why(
                    "is too wide: name a domain below a public suffix (*.example.com)",
                ));
            }
            rest
        }
        None => &h,
    };
    if !crate::host_name::is_dns_name(name) {
        return Err(why(
            "is not a host name, *.domain or IPv4 address (a '*' only as the first label)",
        ));
    }
    Ok(h)
}

fn check_header(at: &str, name: &str, value: &Value) -> ApiResult<String> {
    let token = (1..=MAX_NAME_BYTES).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    if !token {
        return Err(bad(format!(
            "{at} header name {name:?} is not an HTTP header name (1–{MAX_NAME_BYTES} token characters)"
        )));
    }
    if PROXY_OWNED.contains(&name.to_ascii_lowercase().as_str()) {
        return Err(bad(format!(
            "{at} header {name:?} is one the egress proxy writes itself"
        )));
    }
    // Messages name the header, never its value.
    let Value::String(v) = value else {
        return Err(bad(format!(
            "{at} header {name:?}: the value must be a string"
        )));
    };
    if v.contains(IAM_PLACEHOLDER) {
        return Err(bad(format!(
            "{at} header {name:?} uses a workload identity token (iam): not supported by Hatchery (see docs/e2b.md)"
        )));
    }
    if v.is_empty() || v.len() > MAX_VALUE_BYTES {
        return Err(bad(format!(
            "{at} header {name:?}: the value must be 1–{MAX_VALUE_BYTES} bytes"
        )));
    }
    if !v.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Err(bad(format!(
            "{at} header {name:?}: the value must be printable ASCII (no control characters, no line breaks)"
        )));
    }
    Ok(v.clone())
}

/// Keys other than the ones named are refused by name (a typo, or an
/// E2B transform Hatchery does not have).
fn only(at: &str, o: &serde_json::Map<String, Value>, known: &str) -> ApiResult<()> {
    match o.keys().find(|k| k.as_str() != known) {
        Some(k) => Err(bad(format!("{at}.{k} is not supported by Hatchery"))),
        None => Ok(()),
    }
}

/// `network.rules`, checked: the hosts that get headers, each with at
/// least one. `None`, `null` and `{}` are none.
pub fn parse(rules: Option<&Value>) -> ApiResult<Vec<HeaderRule>> {
    let o = match rules {
        None | Some(Value::Null) => return Ok(vec![]),
        Some(Value::Object(o)) => o,
        Some(_) => {
            return Err(bad(
                "network.rules must be an object of host to a list of rules".into(),
            ))
        }
    };
    if o.len() > MAX_HOSTS {
        return Err(bad(format!(
            "network.rules names {} hosts; at most {MAX_HOSTS} are allowed",
            o.len()
        )));
    }
    let mut out: Vec<HeaderRule> = Vec::new();
    let mut seen: Vec<String> = Vec::new();
    let mut total = 0usize;
    for (key, list) in o {
        let host = check_host(key)?;
        if seen.contains(&host) {
            return Err(bad(format!(
                "network.rules names host {host:?} twice (in another case)"
            )));
        }
        seen.push(host.clone());
        let at = format!("network.rules[{key:?}]");
        let Value::Array(list) = list else {
            return Err(bad(format!("{at} must be a list of rules")));
        };
        let mut headers: Vec<(String, String)> = Vec::new();
        for (i, rule) in list.iter().enumerate() {
            let at = format!("{at}[{i}]");
            let rule = match rule {
                Value::Object(r) => r,
                _ => return Err(bad(format!("{at} must be an object"))),
            };
            only(&at, rule, "transform")?;
            let t = match rule.get("transform") {
                None | Some(Value::Null) => continue,
                Some(Value::Object(t)) => t,
                Some(_) => return Err(bad(format!("{at}.transform must be an object"))),
            };
            let at = format!("{at}.transform");
            only(&at, t, "headers")?;
            let h = match t.get("headers") {
                None | Some(Value::Null) => continue,
                Some(Value::Object(h)) => h,
                Some(_) => return Err(bad(format!("{at}.headers must be an object"))),
            };
            for (name, value) in h {
                let v = check_header(&format!("{at}.headers"), name, value)?;
                // E2B replaces a header of the same name (case-blind, as
                // HTTP names are).
                headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
                headers.push((name.clone(), v));
            }
        }
        if headers.is_empty() {
            continue;
        }
        total += headers.len();
        if total > MAX_HEADERS {
            return Err(bad(format!(
                "network.rules sets more than {MAX_HEADERS} headers in all; at most {MAX_HEADERS} are allowed"
            )));
        }
        out.push(HeaderRule { host, headers });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn msg(v: Value) -> String {
        match parse(Some(&v)) {
            Err(e) => {
                assert_eq!(e.status, 400);
                e.message
            }
            Ok(r) => panic!("accepted: {r:?}"),
        }
    }

    fn one(host: &str, headers: Value) -> Value {
        json!({ host: [{"transform": {"headers": headers}}] })
    }

    #[test]
    fn the_sdks_shape_becomes_hosts_with_headers() {
        let r = parse(Some(&json!({
            "API.example.com": [
                {"transform": {"headers": {"Authorization": "Bearer a", "X-Team": "t"}}},
                {"transform": {"headers": {"authorization": "Bearer b"}}},
                {},
                {"transform": null}
            ],
            "*.internal.example.com": [{"transform": {"headers": {"X-Key": "k"}}}],
            "198.19.2.6": [{"transform": {"headers": {"X-Key": "k"}}}],
            "empty.example.com": [{"transform": {}}]
        })))
        .unwrap();
        let api = r.iter().find(|r| r.host == "api.example.com").unwrap();
        assert_eq!(
            api.headers,
            vec![
                ("X-Team".to_string(), "t".to_string()),
                ("authorization".to_string(), "Bearer b".to_string())
            ]
        );
        assert!(r.iter().any(|r| r.host == "*.internal.example.com"));
        assert!(r.iter().any(|r| r.host == "198.19.2.6"));
        // A host whose rules set nothing is none.
        assert_eq!(r.len(), 3);
        assert!(parse(None).unwrap().is_empty());
        assert!(parse(Some(&json!({}))).unwrap().is_empty());
        assert!(parse(Some(&Value::Null)).unwrap().is_empty());
    }

    #[test]
    fn debug_shows_names_never_values() {
        let r = parse(Some(&one(
            "a.example.com",
            json!({"X-Key": "s3cr3t-value"}),
        )))
        .unwrap();
        let d = format!("{r:?}");
        assert!(d.contains("X-Key") && !d.contains("s3cr3t"), "{d}");
    }

    #[test]
    fn hosts_a_credential_binding_cannot_name_are_refused() {
        for (host, want) in [
            ("*", "never for every host"),
            ("*.com", "too wide"),
            ("198.19.0.0/24", "address range"),
            ("::1", "IPv6"),
            ("1.2.3", "IPv4"),
            ("a.*.example.com", "first label"),
            ("bad_name.example", "not a host name"),
            ("", "never for every host"),
        ] {
            let m = msg(one(host, json!({"X": "v"})));
            assert!(
                m.contains(want) && m.contains("network.rules host"),
                "{host}: {m}"
            );
        }
    }

    #[test]
    fn headers_and_values_are_checked_without_echoing_the_value() {
        for (headers, want) in [
            (json!({"Host": "v"}), "proxy writes itself"),
            (json!({"Content-Length": "1"}), "proxy writes itself"),
            (json!({"Bad Name": "v"}), "not an HTTP header name"),
            (json!({"X": "a\r\nX-Evil: 1"}), "printable ASCII"),
            (json!({"X": ""}), "1–4096 bytes"),
            (json!({"X": 5}), "must be a string"),
            (
                json!({"Authorization": "Bearer ${e2b.identity.tokens.aws}"}),
                "workload identity",
            ),
        ] {
            let m = msg(one("a.example.com", headers.clone()));
            assert!(m.contains(want), "{headers}: {m}");
            assert!(
                m.contains("network.rules[\"a.example.com\"][0].transform.headers"),
                "{m}"
            );
            assert!(!m.contains("X-Evil") && !m.contains("Bearer"), "{m}");
        }
        for (v, want) in [
            (json!([]), "must be an object of host"),
            (json!({"a.example.com": {}}), "must be a list"),
            (json!({"a.example.com": [1]}), "must be an object"),
            (
                json!({"a.example.com": [{"match": {}}]}),
                "[0].match is not supported",
            ),
            (
                json!({"a.example.com": [{"transform": {"body": "x"}}]}),
                "transform.body is not supported",
            ),
            (
                json!({"a.example.com": [{"transform": {"headers": []}}]}),
                "headers must be an object",
            ),
            (json!({"A.example.com": [], "a.example.com": []}), "twice"),
        ] {
            let m = msg(v.clone());
            assert!(m.contains(want), "{v}: {m}");
        }
    }

    #[test]
    fn caps_at_the_boundary() {
        let max = "a".repeat(MAX_VALUE_BYTES);
        assert!(parse(Some(&one("a.example.com", json!({"X": max})))).is_ok());
        let over = "a".repeat(MAX_VALUE_BYTES + 1);
        assert!(msg(one("a.example.com", json!({"X": over}))).contains("1–4096 bytes"));
        let name = "n".repeat(MAX_NAME_BYTES);
        assert!(parse(Some(&one("a.example.com", json!({ name: "v" })))).is_ok());
        let name = "n".repeat(MAX_NAME_BYTES + 1);
        assert!(msg(one("a.example.com", json!({ name: "v" }))).contains("header name"));
        let hosts = |n: usize| {
            Value::Object(
                (0..n)
                    .map(|i| {
                        (
                            format!("h{i}.example.com"),
                            json!([{"transform": {"headers": {"X": "v"}}}]),
                        )
                    })
                    .collect(),
            )
        };
        assert_eq!(parse(Some(&hosts(MAX_HOSTS))).unwrap().len(), MAX_HOSTS);
        assert!(msg(hosts(MAX_HOSTS + 1)).contains("names 17 hosts; at most 16"));
        let headers =
            |n: usize| Value::Object((0..n).map(|i| (format!("X-{i}"), json!("v"))).collect());
        let two = |a: usize, b: usize| {
            json!({
                "a.example.com": [{"transform": {"headers": headers(a)}}],
                "b.example.com": [{"transform": {"headers": headers(b)}}]
            })
        };
        assert!(parse(Some(&two(16, 16))).is_ok());
        assert!(msg(two(16, 17)).contains("more than 32 headers"));
    }
}
