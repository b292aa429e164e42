//! Adding a secret to one request: a header (from its template), basic
//! auth, or a query parameter. Whatever the guest sent under that name is
//! replaced, never kept beside it. Values are printable ASCII (the secrets
//! store refuses anything else), so a value cannot start a header of its
//! own.

use base64::Engine;
use hatchery_policy::credential::{Injection, SECRET_SLOT};
use hyper::header::{HeaderName, HeaderValue, AUTHORIZATION};
use hyper::http::uri::PathAndQuery;
use hyper::Uri;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InjectError {
    /// The stored value is not printable ASCII (the store refuses those;
    /// this is a second check).
    #[error("the secret's value cannot go into a request")]
    Value,
    #[error("the request target cannot carry the query parameter")]
    Target,
}

/// Where an injection writes: a header (by its lower-case name; basic auth
/// is `authorization`) or a query parameter.
#[derive(Debug, PartialEq, Eq)]
enum Slot {
    Header(String),
    Query(String),
}

fn slot(how: &Injection) -> Slot {
    match how {
        Injection::Header { name, .. } => Slot::Header(name.to_ascii_lowercase()),
        Injection::Basic { .. } => Slot::Header("authorization".into()),
        Injection::Query { param } => Slot::Query(param.clone()),
    }
}

/// The bindings that go into one request: of those whose method and path
/// hold, the first (in rule order) for each header or query parameter.
/// Bindings that write different places all apply (an E2B sandbox's host
/// may get several headers); two that write the same place never both
/// do, so a later rule cannot replace an earlier one's value.
pub fn chosen<'a>(
    bindings: &'a [hatchery_policy::Credential],
    method: &str,
    target: &str,
) -> Vec<&'a hatchery_policy::Credential> {
    let mut out: Vec<&hatchery_policy::Credential> = Vec::new();
    for c in bindings.iter().filter(|c| c.applies(method, target)) {
        if !out.iter().any(|o| slot(&o.inject) == slot(&c.inject)) {
            out.push(c);
        }
    }
    out
}

/// Adds `secret` to the request's headers or target, as `how` says.
pub fn inject(
    how: &Injection,
    secret: &[u8],
    headers: &mut hyper::HeaderMap,
    uri: &mut Uri,
) -> Result<(), InjectError> {
    if secret.is_empty() || !secret.iter().all(|b| (0x20..0x7f).contains(b)) {
        return Err(InjectError::Value);
    }
    // Checked above: ASCII.
    let value = std::str::from_utf8(secret).map_err(|_| InjectError::Value)?;
    match how {
        Injection::Header { name, template } => {
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| InjectError::Value)?;
            let mut v = HeaderValue::from_str(&template.replacen(SECRET_SLOT, value, 1))
                .map_err(|_| InjectError::Value)?;
            v.set_sensitive(true);
            headers.remove(&name);
            headers.insert(name, v);
        }
        Injection::Basic { username } => {
            let token = zeroize::Zeroizing::new(
                base64::engine::general_purpose::STANDARD.encode(format!("{username}:{value}")),
            );
            let mut v = HeaderValue::from_str(&format!("Basic {}", token.as_str()))
                .map_err(|_| InjectError::Value)?;
            v.set_sensitive(true);
            headers.remove(AUTHORIZATION);
            headers.insert(AUTHORIZATION, v);
        }
        Injection::Query { param } => {
            let pq = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
            let (path, query) = match pq.split_once('?') {
                Some((p, q)) => (p, Some(q)),
                None => (pq, None),
            };
            let mut kept: Vec<&str> = query
                .into_iter()
                .flat_map(|q| q.split('&'))
                .filter(|kv| !kv.is_empty() && kv.split('=').next() != Some(param.as_str()))
                .collect();
            let pair = format!("{param}={}", encode(value));
            kept.push(&pair);
            let new = format!("{path}?{}", kept.join("&"));
            let pq = PathAndQuery::try_from(new).map_err(|_| InjectError::Target)?;
            let mut parts = std::mem::take(uri).into_parts();
            parts.path_and_query = Some(pq);
            *uri = Uri::from_parts(parts).map_err(|_| InjectError::Target)?;
        }
    }
    Ok(())
}

/// Percent-encodes all but RFC 3986's unreserved characters.
fn encode(v: &str) -> String {
    let mut out = String::with_capacity(v.len() * 3);
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(
        rule: &str,
        how: Injection,
        methods: Option<&[&str]>,
    ) -> hatchery_policy::Credential {
        hatchery_policy::Credential {
            rule_id: rule.into(),
            secret: "S".into(),
            inject: how,
            methods: methods.map(|m| m.iter().map(|x| x.to_string()).collect()),
            path_prefix: "/api/".into(),
            scheme: hatchery_policy::Scheme::Https,
            env: None,
        }
    }

    fn header(name: &str) -> Injection {
        Injection::Header {
            name: name.into(),
            template: "{secret}".into(),
        }
    }

    #[test]
    fn each_place_gets_the_first_binding_that_holds() {
        let b = vec![
            binding("post-only", header("X-Key"), Some(&["POST"])),
            binding("key", header("X-Key"), None),
            binding("key-again", header("x-key"), None),
            binding("team", header("X-Team"), None),
            binding(
                "basic",
                Injection::Basic {
                    username: "u".into(),
                },
                None,
            ),
            binding("bearer", header("Authorization"), None),
            binding("q", Injection::Query { param: "t".into() }, None),
            binding("q-again", Injection::Query { param: "t".into() }, None),
        ];
        let ids = |m, t| {
            chosen(&b, m, t)
                .iter()
                .map(|c| c.rule_id.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(ids("GET", "/api/x"), ["key", "team", "basic", "q"]);
        assert_eq!(ids("POST", "/api/x"), ["post-only", "team", "basic", "q"]);
        assert!(ids("GET", "/other").is_empty());
    }

    fn run(how: Injection, uri: &str, pre: &[(&str, &str)]) -> (hyper::HeaderMap, Uri) {
        let mut h = hyper::HeaderMap::new();
        for (k, v) in pre {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        let mut u: Uri = uri.parse().unwrap();
        inject(&how, b"s3cr&t", &mut h, &mut u).unwrap();
        (h, u)
    }

    #[test]
    fn header_replaces_what_the_guest_sent() {
        let how = Injection::Header {
            name: "Authorization".into(),
            template: "Bearer {secret}".into(),
        };
        let (h, _) = run(
            how,
            "/x",
            &[("authorization", "Bearer guest"), ("authorization", "two")],
        );
        let all: Vec<_> = h.get_all(AUTHORIZATION).iter().collect();
        assert_eq!(all, vec!["Bearer s3cr&t"]);
        assert!(all[0].is_sensitive());
    }

    #[test]
    fn basic_and_query() {
        let (h, _) = run(
            Injection::Basic {
                username: "x-token".into(),
            },
            "/",
            &[],
        );
        let want = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("x-token:s3cr&t")
        );
        assert_eq!(h.get(AUTHORIZATION).unwrap(), want.as_str());
        let (_, u) = run(
            Injection::Query {
                param: "token".into(),
            },
            "/simple/?token=guest&a=1",
            &[],
        );
        assert_eq!(u.to_string(), "/simple/?a=1&token=s3cr%26t");
    }

    #[test]
    fn control_bytes_never_go_in() {
        let mut h = hyper::HeaderMap::new();
        let mut u: Uri = "/".parse().unwrap();
        let how = Injection::Header {
            name: "X".into(),
            template: "{secret}".into(),
        };
        assert_eq!(
            inject(&how, b"a\r\nEvil: 1", &mut h, &mut u),
            Err(InjectError::Value)
        );
        assert!(h.is_empty());
    }
}
