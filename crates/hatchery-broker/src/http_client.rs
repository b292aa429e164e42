//! One HTTP/1.1 request from the broker to an outside service
//! (`http_fetch`, the forge API of `open_pr`): over TLS verified against
//! the broker's trust (`--broker-ca-file`, the system bundle by default)
//! or plain, bounded in time by the caller and in answer size here.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::Request;
use hyper_util::rt::TokioIo;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::rustls::ClientConfig;

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("cannot connect to {addr}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the broker's TLS trust")]
    Trust(#[source] hatchery_tls::TrustError),
    #[error(transparent)]
    Tls(#[from] hatchery_tls::ConnectError),
    #[error("HTTP with {addr}")]
    Http {
        addr: String,
        #[source]
        source: hyper::Error,
    },
    #[error("the request")]
    Request(#[from] hyper::http::Error),
    #[error("the answer's body (at most {max} bytes)")]
    Body {
        max: usize,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// What the broker's https calls trust: a PEM bundle, read at the first
/// https call (a bad `--broker-ca-file` is also refused at start, by
/// [`Trust::check`]) and kept.
#[derive(Debug)]
pub struct Trust {
    bundle: PathBuf,
    cfg: Mutex<Option<Arc<ClientConfig>>>,
}

impl Default for Trust {
    fn default() -> Self {
        Trust::new(PathBuf::from(hatchery_tls::SYSTEM_BUNDLE))
    }
}

impl Trust {
    pub fn new(bundle: PathBuf) -> Self {
        Trust {
            bundle,
            cfg: Mutex::new(None),
        }
    }

    pub fn check(&self) -> Result<(), hatchery_tls::TrustError> {
        self.config().map(|_| ())
    }

    fn config(&self) -> Result<Arc<ClientConfig>, hatchery_tls::TrustError> {
        let mut g = self.cfg.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = &*g {
            return Ok(c.clone());
        }
        let c = hatchery_tls::client_config(&self.bundle)?;
        *g = Some(c.clone());
        Ok(c)
    }
}

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
    why: &'static str,
}

impl Base {
    pub fn parse(url: &str) -> Result<Base, BaseError> {
        let bad = |why| BaseError {
            url: url.to_string(),
            why,
        };
        let (tls, rest) = match (url.strip_prefix("https://"), url.strip_prefix("http://")) {
            (Some(r), _) => (true, r),
            (_, Some(r)) => (false, r),
            _ => return Err(bad("must be https:// (or http:// to a loopback address)")),
        };
        let (authority, prefix) = match rest.split_once('/') {
            Some((h, p)) => (h, format!("/{}", p.trim_end_matches('/'))),
            None => (rest, String::new()),
        };
        let prefix = if prefix == "/" { String::new() } else { prefix };
        if authority.contains(['?', '#']) {
            return Err(bad("no host, or user info in it"));
        }
        let (host, port) = split_authority(authority, if tls { 443 } else { 80 })
            .ok_or_else(|| bad("no host, user info in it, or a bad port"))?;
        let (host, hostport) = (host.to_string(), format!("{host}:{port}"));
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let loopback = bare == "localhost"
            || bare
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        if !tls && !loopback {
            return Err(bad(
                "plain http:// only to a loopback address (a credential would travel in clear)",
            ));
        }
        Ok(Base {
            tls,
            host,
            hostport,
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

/// `(host, port)` of a URL's authority: the host as written (brackets
/// kept for IPv6), the port given (not 0) or `default`. None for an empty
/// host, user info (`@`: a credential in a URL is never sent), or a bad
/// port. Shared by operator base URLs and `http_fetch`'s URLs.
pub(crate) fn split_authority(authority: &str, default: u16) -> Option<(&str, u16)> {
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

/// Where a request goes: the address dialled (already checked by the
/// caller), the host its certificate must name, and whether to use TLS.
pub struct Target<'a> {
    pub addr: &'a str,
    pub host: &'a str,
    pub tls: bool,
}

/// An answer: its status, headers and at most the caller's cap of body.
pub struct Answer {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub body: Bytes,
}

/// Sends `req` and returns the answer with at most `max` bytes of body.
pub async fn send(
    trust: &Trust,
    to: Target<'_>,
    req: Request<Full<Bytes>>,
    max: usize,
) -> Result<Answer, HttpError> {
    let tcp = tokio::net::TcpStream::connect(to.addr)
        .await
        .map_err(|source| HttpError::Connect {
            addr: to.addr.to_string(),
            source,
        })?;
    if to.tls {
        let cfg = trust.config().map_err(HttpError::Trust)?;
        let tls = hatchery_tls::connect(&cfg, to.host, tcp).await?;
        exchange(tls, to.addr, req, max).await
    } else {
        exchange(tcp, to.addr, req, max).await
    }
}

async fn exchange<S>(
    io: S,
    addr: &str,
    req: Request<Full<Bytes>>,
    max: usize,
) -> Result<Answer, HttpError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let http = |source| HttpError::Http {
        addr: addr.to_string(),
        source,
    };
    let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(http)?;
    tokio::spawn(conn);
    let resp = tx.send_request(req).await.map_err(http)?;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = Limited::new(resp.into_body(), max)
        .collect()
        .await
        .map_err(|source| HttpError::Body { max, source })?
        .to_bytes();
    Ok(Answer {
        status,
        headers,
        body,
    })
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
    }
}
