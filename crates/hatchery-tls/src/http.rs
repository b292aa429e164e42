//! One HTTP/1.1 exchange with an outside service, for every caller that
//! talks to one on the host's behalf (the broker's `http_fetch`, the forge
//! API and MCP servers; the audit anchors' object store): a fresh
//! connection per request, TLS verified against a [`Trust`], and the
//! answer's body capped, or handed over as a stream ([`open`]) for a
//! caller that reads it incrementally under its own caps.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
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
    #[error("the TLS trust (CA bundle)")]
    Trust(#[source] crate::TrustError),
    #[error(transparent)]
    Tls(#[from] crate::ConnectError),
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

/// What https calls trust: a PEM bundle (the system's by default, or an
/// operator's CA file), read at the first https call, or at start by
/// [`Trust::check`] so a bad file is refused early, and kept.
#[derive(Debug)]
pub struct Trust {
    bundle: PathBuf,
    cfg: Mutex<Option<Arc<ClientConfig>>>,
}

impl Default for Trust {
    fn default() -> Self {
        Trust::new(PathBuf::from(crate::SYSTEM_BUNDLE))
    }
}

impl Trust {
    pub fn new(bundle: PathBuf) -> Self {
        Trust {
            bundle,
            cfg: Mutex::new(None),
        }
    }

    pub fn check(&self) -> Result<(), crate::TrustError> {
        self.config().map(|_| ())
    }

    fn config(&self) -> Result<Arc<ClientConfig>, crate::TrustError> {
        let mut g = self.cfg.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = &*g {
            return Ok(c.clone());
        }
        let c = crate::client_config(&self.bundle)?;
        *g = Some(c.clone());
        Ok(c)
    }
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
    let resp = open(trust, to, req).await?;
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

/// Sends `req` and returns the answer with its body unread: the caller
/// reads it frame by frame (an event stream) and bounds it itself. The
/// connection lives as long as the body.
pub async fn open(
    trust: &Trust,
    to: Target<'_>,
    req: Request<Full<Bytes>>,
) -> Result<hyper::Response<Incoming>, HttpError> {
    let tcp = tokio::net::TcpStream::connect(to.addr)
        .await
        .map_err(|source| HttpError::Connect {
            addr: to.addr.to_string(),
            source,
        })?;
    if to.tls {
        let cfg = trust.config().map_err(HttpError::Trust)?;
        let tls = crate::connect(&cfg, to.host, tcp).await?;
        exchange(tls, to.addr, req).await
    } else {
        exchange(tcp, to.addr, req).await
    }
}

async fn exchange<S>(
    io: S,
    addr: &str,
    req: Request<Full<Bytes>>,
) -> Result<hyper::Response<Incoming>, HttpError>
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
    tx.send_request(req).await.map_err(http)
}
