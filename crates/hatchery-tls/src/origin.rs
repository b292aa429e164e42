//! The scheme and authority of an operator-configured URL the host sends
//! something worth protecting to (a credential, an audit anchor):
//! `https://`, or plain `http://` to a loopback address only (a local
//! relay or a test's server), so it never travels in clear over a network.

/// `https://host[:port]` or `http://loopback[:port]`, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub tls: bool,
    /// The host a certificate must name (brackets kept for IPv6).
    pub host: String,
    /// What is dialled and sent as `Host`.
    pub hostport: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OriginError {
    #[error("must be https:// (or http:// to a loopback address)")]
    Scheme,
    #[error("no host, user info in it, or a bad port")]
    Authority,
    #[error("plain http:// only to a loopback address (it would travel unprotected)")]
    NotLoopback,
}

impl Origin {
    /// The origin of `url` and the rest of it (from the first `/`, or
    /// empty).
    pub fn split(url: &str) -> Result<(Origin, &str), OriginError> {
        let (tls, rest) = match (url.strip_prefix("https://"), url.strip_prefix("http://")) {
            (Some(r), _) => (true, r),
            (_, Some(r)) => (false, r),
            _ => return Err(OriginError::Scheme),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if authority.contains(['?', '#']) {
            return Err(OriginError::Authority);
        }
        let (host, port) =
            split_authority(authority, if tls { 443 } else { 80 }).ok_or(OriginError::Authority)?;
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let loopback = bare == "localhost"
            || bare
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        if !tls && !loopback {
            return Err(OriginError::NotLoopback);
        }
        Ok((
            Origin {
                tls,
                host: host.to_string(),
                hostport: format!("{host}:{port}"),
            },
            path,
        ))
    }
}

/// `(host, port)` of a URL's authority: the host as written (brackets
/// kept for IPv6), the port given (not 0) or `default`. None for an empty
/// host, user info (`@`: a credential in a URL is never sent), or a bad
/// port.
pub fn split_authority(authority: &str, default: u16) -> Option<(&str, u16)> {
    if authority.contains('@') {
        return None;
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => {
            (h, p.parse().ok().filter(|p| *p != 0)?)
        }
        _ => (authority, default),
    };
    (!host.is_empty()).then_some((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn https_anywhere_plain_http_to_loopback_only() {
        let (o, rest) = Origin::split("https://ghe.corp:8443/api/v3/").unwrap();
        assert_eq!(
            (o.tls, o.host.as_str(), o.hostport.as_str(), rest),
            (true, "ghe.corp", "ghe.corp:8443", "/api/v3/")
        );
        let (o, rest) = Origin::split("https://api.github.com").unwrap();
        assert_eq!((o.hostport.as_str(), rest), ("api.github.com:443", ""));
        let (o, _) = Origin::split("http://[::1]:81/x").unwrap();
        assert_eq!((o.tls, o.host.as_str()), (false, "[::1]"));
        assert!(Origin::split("http://127.0.0.1:81/mcp").is_ok());
        assert!(Origin::split("http://localhost").is_ok());
        for (bad, why) in [
            ("ftp://h", OriginError::Scheme),
            ("s3://bkt/p", OriginError::Scheme),
            ("http://forge.corp", OriginError::NotLoopback),
            ("http://10.0.0.1:80", OriginError::NotLoopback),
            ("https://", OriginError::Authority),
            ("https:///p", OriginError::Authority),
            ("https://:9000/p", OriginError::Authority),
            ("https://u@h", OriginError::Authority),
            ("https://h:0", OriginError::Authority),
            ("https://h:x", OriginError::Authority),
            ("https://h?x=1", OriginError::Authority),
        ] {
            assert_eq!(Origin::split(bad), Err(why), "{bad}");
        }
    }

    #[test]
    fn authorities() {
        assert_eq!(split_authority("h", 443), Some(("h", 443)));
        assert_eq!(split_authority("h:8080", 443), Some(("h", 8080)));
        assert_eq!(split_authority("[::1]:81", 80), Some(("[::1]", 81)));
        assert_eq!(split_authority("u:p@h", 80), None);
        assert_eq!(split_authority("", 80), None);
        assert_eq!(split_authority("h:70000", 80), None);
    }
}
