//! `http_fetch`: one HTTP request the broker makes for the agent, after
//! the pinned policy allowed its destination (tool `http_fetch`, host and
//! port). `https://` is verified against the broker's trust
//! (`--broker-ca-file`, the system bundle by default); a name that
//! resolves to a loopback, private or other special address is refused
//! (only an IP literal the policy names reaches those), and the request
//! goes to the address that was checked.

use crate::http_client::{self, HttpError, Target, Trust};
use bytes::Bytes;
use http_body_util::Full;
use serde_json::{json, Value};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(30);
const MAX_RESPONSE: usize = 1 << 20;
const MAX_BODY: usize = 64 << 10;

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("http_fetch: the DNS lookup of {0} timed out")]
    DnsTimeout(String),
    #[error("http_fetch: resolving {host}")]
    Dns {
        host: String,
        #[source]
        source: std::io::Error,
    },
    #[error("http_fetch: {0} has no address")]
    NoAddress(String),
    #[error("http_fetch: {host} resolves to {ip}, a special-purpose address; only a rule naming that address reaches it")]
    Special { host: String, ip: IpAddr },
    #[error("http_fetch")]
    Http(#[from] HttpError),
    #[error("http_fetch: timed out after {}s", TIMEOUT.as_secs())]
    Timeout,
}

pub struct Fetch {
    https: bool,
    method: String,
    host: String,
    port: u16,
    path: String,
    body: Option<String>,
}

/// `(scheme, host, port, path)` of an http(s) URL (no userinfo).
fn parse(url: &str) -> Option<(&str, String, u16, String)> {
    let (scheme, rest) = url.split_once("://")?;
    let default = match scheme {
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    let (auth, path) = match rest.find(['/', '?']) {
        Some(i) => (&rest[..i], rest[i..].to_string()),
        None => (rest, "/".to_string()),
    };
    let (host, port) = crate::http_client::split_authority(auth, default)?;
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase();
    if host.is_empty() || host.ends_with('.') || !host.is_ascii() {
        return None;
    }
    let path = if path.starts_with('?') {
        format!("/{path}")
    } else {
        path
    };
    Some((scheme, host, port, path))
}

/// The destination the policy sees for a call, if it has one.
pub fn destination(tool: &str, args: &Value) -> Option<(String, u16)> {
    if tool != "http_fetch" {
        return None;
    }
    let (_, h, p, _) = parse(args.get("url")?.as_str()?)?;
    Some((h, p))
}

pub fn plan(args: &Value) -> Result<(Value, Fetch), String> {
    let url = args
        .get("url")
        .and_then(Value::as_str)
        .ok_or("http_fetch needs a url")?;
    let (scheme, host, port, path) =
        parse(url).ok_or_else(|| format!("not an http(s) URL: {url:?}"))?;
    let method = args
        .get("method")
        .and_then(Value::as_str)
        .unwrap_or("GET")
        .to_ascii_uppercase();
    if !matches!(method.as_str(), "GET" | "POST" | "HEAD") {
        return Err(format!("method {method} not allowed (GET, POST, HEAD)"));
    }
    let body = args.get("body").and_then(Value::as_str).map(str::to_string);
    if body.as_ref().is_some_and(|b| b.len() > MAX_BODY) {
        return Err(format!("body over {MAX_BODY} bytes"));
    }
    let effect = json!({"method": method, "host": host, "port": port, "path": path});
    Ok((
        effect,
        Fetch {
            https: scheme == "https",
            method,
            host,
            port,
            path,
            body,
        },
    ))
}

fn special(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => {
            a.is_loopback()
                || a.is_private()
                || a.is_link_local()
                || a.is_unspecified()
                || a.is_multicast()
                || a.is_broadcast()
                || a.is_documentation()
                || (a.octets()[0] == 100 && (a.octets()[1] & 0xc0) == 64)
        }
        IpAddr::V6(a) => {
            a.is_loopback()
                || a.is_unspecified()
                || a.is_multicast()
                || (a.segments()[0] & 0xfe00) == 0xfc00
                || (a.segments()[0] & 0xffc0) == 0xfe80
                || a.to_ipv4_mapped().is_some()
        }
    }
}

impl Fetch {
    async fn addr(&self) -> Result<SocketAddr, FetchError> {
        if let Ok(ip) = self.host.parse::<IpAddr>() {
            // An IP literal: the policy matched exactly this address.
            return Ok(SocketAddr::new(ip, self.port));
        }
        let mut addrs = tokio::time::timeout(
            Duration::from_secs(5),
            tokio::net::lookup_host((self.host.as_str(), self.port)),
        )
        .await
        .map_err(|_| FetchError::DnsTimeout(self.host.clone()))?
        .map_err(|source| FetchError::Dns {
            host: self.host.clone(),
            source,
        })?;
        let a = addrs
            .next()
            .ok_or_else(|| FetchError::NoAddress(self.host.clone()))?;
        if special(a.ip()) {
            return Err(FetchError::Special {
                host: self.host.clone(),
                ip: a.ip(),
            });
        }
        Ok(a)
    }

    pub async fn run(self, trust: &Trust) -> Result<Value, FetchError> {
        let fut = async {
            let addr = self.addr().await?.to_string();
            let default_port = if self.https { 443 } else { 80 };
            let host = if self.port == default_port {
                self.host.clone()
            } else {
                format!("{}:{}", self.host, self.port)
            };
            let req = hyper::Request::builder()
                .method(self.method.as_str())
                .uri(&self.path)
                .header("host", host)
                .header("user-agent", "hatchery-broker")
                .body(Full::new(Bytes::from(
                    self.body.clone().unwrap_or_default(),
                )))
                .map_err(HttpError::from)?;
            let to = Target {
                addr: &addr,
                host: &self.host,
                tls: self.https,
            };
            let a = http_client::send(trust, to, req, MAX_RESPONSE).await?;
            Ok(json!({"status": a.status, "body": String::from_utf8_lossy(&a.body)}))
        };
        tokio::time::timeout(TIMEOUT, fut)
            .await
            .map_err(|_| FetchError::Timeout)?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            destination("http_fetch", &json!({"url": "https://evil.example/x"})),
            Some(("evil.example".into(), 443))
        );
        assert_eq!(
            destination("http_fetch", &json!({"url": "http://127.0.0.1:8080/p?q"})),
            Some(("127.0.0.1".into(), 8080))
        );
        assert_eq!(
            destination("http_fetch", &json!({"url": "http://u:p@h/"})),
            None
        );
        assert_eq!(destination("http_fetch", &json!({"url": "ftp://h/"})), None);
        assert_eq!(destination("git_push", &json!({"url": "http://h/"})), None);
        assert!(special("10.0.0.1".parse().unwrap()));
        assert!(special("100.64.0.1".parse().unwrap()));
        assert!(!special("93.184.216.34".parse().unwrap()));
    }
}
