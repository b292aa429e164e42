//! One HTTP/1.1 exchange with the object store: a fresh connection per
//! request (anchoring is one put a round; verifying is a batch job), TLS
//! verified by hatchery-tls, the answer's body capped.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use std::sync::Arc;
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

pub struct Answer {
    pub status: u16,
    pub body: Bytes,
}

/// Where a request goes.
pub struct Target<'a> {
    pub addr: &'a str,
    pub host: &'a str,
    /// None: plain http (checked to be loopback when the URL was parsed).
    pub tls: Option<&'a Arc<ClientConfig>>,
}

/// Sends `method url` (a presigned URL: its path and query are the
/// request target) with `headers` and `body`; at most `max` bytes of
/// answer are read.
pub async fn send(
    to: Target<'_>,
    method: hyper::Method,
    url: &url::Url,
    headers: &[(&str, &str)],
    body: Bytes,
    max: usize,
) -> Result<Answer, HttpError> {
    let target = match url.query() {
        Some(q) => format!("{}?{q}", url.path()),
        None => url.path().to_string(),
    };
    let host = match url.port() {
        Some(p) => format!("{}:{p}", url.host_str().unwrap_or_default()),
        None => url.host_str().unwrap_or_default().to_string(),
    };
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(target)
        .header(hyper::header::HOST, host)
        .header(hyper::header::CONTENT_LENGTH, body.len());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(body))?;
    let tcp = tokio::net::TcpStream::connect(to.addr)
        .await
        .map_err(|source| HttpError::Connect {
            addr: to.addr.to_string(),
            source,
        })?;
    match to.tls {
        Some(cfg) => {
            let tls = hatchery_tls::connect(cfg, to.host, tcp).await?;
            exchange(tls, to.addr, req, max).await
        }
        None => exchange(tcp, to.addr, req, max).await,
    }
}

async fn exchange<S>(
    io: S,
    addr: &str,
    req: hyper::Request<Full<Bytes>>,
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
    let body = Limited::new(resp.into_body(), max)
        .collect()
        .await
        .map_err(|source| HttpError::Body { max, source })?
        .to_bytes();
    Ok(Answer { status, body })
}
