//! Parsing what a client asks the proxy for, strictly: one spelling per
//! destination, so that the policy sees the same host the proxy dials.
//! Refused: non-ASCII (raw IDN) and trailing-dot names, names that read as
//! IP spellings (`2130706433`, `0x7f.1`, `0177.0.0.1`), IPv4 with leading
//! zeros, userinfo in absolute-form URLs, schemes other than `http`, and
//! anything but a plain decimal port.

use hatchery_policy::compile::valid_hostname;
use std::net::{IpAddr, Ipv4Addr};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("malformed request line")]
    RequestLine,
    #[error("bad host: {0}")]
    Host(String),
    #[error("bad port")]
    Port,
    #[error("userinfo in the URL is refused")]
    Userinfo,
    #[error("only http:// URLs are forwarded; use CONNECT for https")]
    Scheme,
    #[error("method {0} is not proxied")]
    Method(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    /// Lower-case ASCII, no trailing dot.
    Name(String),
    Ip(IpAddr),
}

impl Host {
    /// The form the policy's `hosts` patterns match.
    pub fn as_policy_str(&self) -> String {
        match self {
            Host::Name(n) => n.clone(),
            Host::Ip(ip) => ip.to_string(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub host: Host,
    pub port: u16,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Connect(Target),
    /// Plain HTTP: method, target, and the origin-form path to send on.
    Forward {
        method: String,
        target: Target,
        path: String,
    },
}

/// The request line (`METHOD SP target SP HTTP/1.x`).
pub fn parse_request_line(line: &str) -> Result<Request, TargetError> {
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(TargetError::RequestLine);
    };
    if !matches!(version, "HTTP/1.1" | "HTTP/1.0")
        || method.is_empty()
        || !method.bytes().all(|b| b.is_ascii_uppercase())
        || target.is_empty()
        || !target.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(TargetError::RequestLine);
    }
    if method == "CONNECT" {
        return Ok(Request::Connect(parse_authority(target, None)?));
    }
    if !matches!(
        method,
        "GET" | "HEAD" | "POST" | "PUT" | "DELETE" | "PATCH" | "OPTIONS"
    ) {
        return Err(TargetError::Method(method.to_string()));
    }
    let rest = match target.split_once("://") {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => rest,
        Some(_) => return Err(TargetError::Scheme),
        None => return Err(TargetError::RequestLine),
    };
    let (authority, path) = match rest.find(['/', '?', '#']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if path.contains('#') {
        return Err(TargetError::RequestLine);
    }
    let path = if path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_string()
    };
    Ok(Request::Forward {
        method: method.to_string(),
        target: parse_authority(authority, Some(80))?,
        path,
    })
}

/// `host:port`, `[v6]:port`, or (for absolute URLs) `host` with a default.
pub fn parse_authority(a: &str, default_port: Option<u16>) -> Result<Target, TargetError> {
    if a.contains('@') {
        return Err(TargetError::Userinfo);
    }
    let (host, port) = if let Some(rest) = a.strip_prefix('[') {
        let (h, after) = rest.split_once(']').ok_or(TargetError::Host(a.into()))?;
        let ip: std::net::Ipv6Addr = h.parse().map_err(|_| TargetError::Host(h.into()))?;
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p),
            None if after.is_empty() => None,
            None => return Err(TargetError::Host(a.into())),
        };
        (Host::Ip(IpAddr::V6(ip)), port)
    } else {
        let (h, p) = match a.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (a, None),
        };
        (parse_host(h)?, p)
    };
    let port = match port {
        Some(p) => parse_port(p)?,
        None => default_port.ok_or(TargetError::Port)?,
    };
    Ok(Target { host, port })
}

fn parse_port(p: &str) -> Result<u16, TargetError> {
    if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) || p.starts_with('0') {
        return Err(TargetError::Port);
    }
    p.parse().ok().filter(|&n| n != 0).ok_or(TargetError::Port)
}

fn parse_host(h: &str) -> Result<Host, TargetError> {
    let bad = || TargetError::Host(h.to_string());
    if h.is_empty() || h.len() > 253 || !h.is_ascii() || h.ends_with('.') {
        return Err(bad());
    }
    let lower = h.to_ascii_lowercase();
    // Anything made of digits, dots and hex markers is an IP spelling: only
    // the canonical dotted quad is accepted.
    let ip_like = lower
        .split('.')
        .all(|l| !l.is_empty() && (l.bytes().all(|b| b.is_ascii_digit()) || l.starts_with("0x")));
    if ip_like {
        return canonical_v4(&lower)
            .map(|a| Host::Ip(IpAddr::V4(a)))
            .ok_or_else(bad);
    }
    if lower.contains(':') || !valid_hostname(&lower) {
        return Err(bad());
    }
    Ok(Host::Name(lower))
}

fn canonical_v4(s: &str) -> Option<Ipv4Addr> {
    let a: Ipv4Addr = s.parse().ok()?;
    // std refuses leading zeros and short forms; compare to be sure.
    (a.to_string() == s).then_some(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connect(a: &str) -> Result<Target, TargetError> {
        match parse_request_line(&format!("CONNECT {a} HTTP/1.1"))? {
            Request::Connect(t) => Ok(t),
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn connect_targets() {
        assert_eq!(
            connect("PyPI.org:443").unwrap(),
            Target {
                host: Host::Name("pypi.org".into()),
                port: 443
            }
        );
        assert_eq!(
            connect("127.0.0.1:8080").unwrap().host,
            Host::Ip("127.0.0.1".parse().unwrap())
        );
        assert_eq!(
            connect("[::1]:443").unwrap().host,
            Host::Ip("::1".parse().unwrap())
        );
        for bad in [
            "pypi.org.:443",
            "pypi.org",
            "pypi.org:",
            "pypi.org:0",
            "pypi.org:65536",
            "pypi.org:+443",
            "pypi.org:0443",
            "bücher.de:443",
            "xn--bcher-kva.de.:443",
            "2130706433:80",
            "0x7f000001:80",
            "0x7f.0.0.1:80",
            "0177.0.0.1:80",
            "127.1:80",
            "127.000.0.1:80",
            "[::1]443",
            "[::1:443",
            "user@host:443",
            "a..b:443",
            "-a.com:443",
            "host_name:443",
            "::1:443",
        ] {
            assert!(connect(bad).is_err(), "{bad} accepted");
        }
        assert_eq!(
            connect("xn--bcher-kva.de:443").unwrap().host,
            Host::Name("xn--bcher-kva.de".into())
        );
    }

    #[test]
    fn request_lines() {
        assert!(parse_request_line("CONNECT  pypi.org:443 HTTP/1.1").is_err());
        assert!(parse_request_line("CONNECT pypi.org:443 HTTP/2").is_err());
        assert!(parse_request_line("CONNECT pypi.org:443").is_err());
        assert!(parse_request_line("connect pypi.org:443 HTTP/1.1").is_err());
        assert!(parse_request_line("CONNECT pypi.org:443 HTTP/1.1 x").is_err());
        assert_eq!(
            parse_request_line("GET http://Example.com/a?b HTTP/1.1").unwrap(),
            Request::Forward {
                method: "GET".into(),
                target: Target {
                    host: Host::Name("example.com".into()),
                    port: 80
                },
                path: "/a?b".into()
            }
        );
        assert_eq!(
            parse_request_line("GET http://example.com:8080 HTTP/1.0").unwrap(),
            Request::Forward {
                method: "GET".into(),
                target: Target {
                    host: Host::Name("example.com".into()),
                    port: 8080
                },
                path: "/".into()
            }
        );
        assert_eq!(
            parse_request_line("GET http://u:p@example.com/ HTTP/1.1"),
            Err(TargetError::Userinfo)
        );
        assert_eq!(
            parse_request_line("GET https://example.com/ HTTP/1.1"),
            Err(TargetError::Scheme)
        );
        assert_eq!(
            parse_request_line("GET /relative HTTP/1.1"),
            Err(TargetError::RequestLine)
        );
        assert!(matches!(
            parse_request_line("TRACE http://e.com/ HTTP/1.1"),
            Err(TargetError::Method(_))
        ));
    }
}
