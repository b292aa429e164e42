//! One HTTP/1.1 request from the broker to an outside service
//! (`http_fetch`, the forge API of `open_pr`, MCP servers): the exchange
//! is hatchery-tls's (shared with the audit anchors' object store), over
//! TLS verified against the broker's trust (`--broker-ca-file`, the system
//! bundle by default) or plain, bounded in time by the caller and in
//! answer size there.

pub use hatchery_tls::http::{open, send, Answer, HttpError, Target, Trust};
pub(crate) use hatchery_tls::origin::split_authority;
use hatchery_tls::origin::{Origin, OriginError};

/// An operator-configured endpoint the broker sends a host-held
/// credential to (the forge API, an MCP server): `https://`, or plain
/// `http://` to a loopback address only (a local relay), so the
/// credential never travels in clear over a network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Base {
    pub tls: bool,
    /// The host a certificate must name (brackets kept for IPv6).
    pub host: String,
    /// What is dialled and sent as `Host`.
    pub hostport: String,
    /// The path, without a trailing slash (may be empty).
    pub prefix: String,
}

#[derive(Debug, thiserror::Error)]
#[error("URL {url:?}: {why}")]
pub struct BaseError {
    url: String,
    why: OriginError,
}

impl Base {
    pub fn parse(url: &str) -> Result<Base, BaseError> {
        let (o, path) = Origin::split(url).map_err(|why| BaseError {
            url: url.to_string(),
            why,
        })?;
        let prefix = path.trim_end_matches('/').to_string();
        Ok(Base {
            tls: o.tls,
            host: o.host,
            hostport: o.hostport,
            prefix,
        })
    }

    pub fn target(&self) -> Target<'_> {
        Target {
            addr: &self.hostport,
            host: &self.host,
            tls: self.tls,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_go_over_tls_or_to_loopback_only() {
        let b = Base::parse("https://api.github.com").unwrap();
        assert_eq!(
            (
                b.tls,
                b.host.as_str(),
                b.hostport.as_str(),
                b.prefix.as_str()
            ),
            (true, "api.github.com", "api.github.com:443", "")
        );
        let b = Base::parse("https://ghe.corp:8443/api/v3/").unwrap();
        assert_eq!(
            (b.hostport.as_str(), b.prefix.as_str()),
            ("ghe.corp:8443", "/api/v3")
        );
        assert_eq!(Base::parse("https://h/").unwrap().prefix, "");
        assert!(Base::parse("http://127.0.0.1:81/mcp").is_ok());
        assert!(Base::parse("http://[::1]:81").is_ok());
        assert!(Base::parse("http://localhost:81").is_ok());
        for bad in [
            "http://forge.corp",
            "http://10.0.0.1:80",
            "ftp://h",
            "https://",
            "https://u@h",
            "https://h:0",
            "https://h:x",
        ] {
            assert!(Base::parse(bad).is_err(), "{bad}");
        }
        let e = Base::parse("http://forge.corp").unwrap_err().to_string();
        assert!(e.contains("loopback"), "{e}");
    }
}
