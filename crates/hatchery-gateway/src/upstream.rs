//! The operator's upstream model endpoint: one HTTP/1.1 connection per
//! call, the real key added here (callers never see it).

use crate::usage::Flavor;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
use std::time::Duration;
use tokio::net::TcpStream;

#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("upstream URL {0:?} must be http://host:port[/prefix] (TLS upstreams are not supported yet)")]
    BadUrl(String),
    #[error("cannot reach the upstream {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("HTTP error talking to the upstream {addr}: {source}")]
    Http {
        addr: String,
        #[source]
        source: hyper::Error,
    },
    #[error("the upstream {addr} did not answer within {0:?}", .timeout)]
    Timeout { addr: String, timeout: Duration },
}

/// Where one flavor's calls go.
#[derive(Debug, Clone)]
pub struct Upstream {
    pub flavor: Flavor,
    /// host:port
    addr: String,
    /// Path prefix before `/v1/...`, without a trailing slash.
    prefix: String,
    key: String,
    timeout: Duration,
}

impl Upstream {
    pub fn new(
        flavor: Flavor,
        url: &str,
        key: &str,
        timeout: Duration,
    ) -> Result<Self, UpstreamError> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| UpstreamError::BadUrl(url.into()))?;
        let (addr, prefix) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        if addr.is_empty() || !addr.contains(':') || addr.contains('@') {
            return Err(UpstreamError::BadUrl(url.into()));
        }
        Ok(Upstream {
            flavor,
            addr: addr.to_string(),
            prefix: prefix.to_string(),
            key: key.to_string(),
            timeout,
        })
    }

    /// Sends `body` to `path` (for example `/v1/chat/completions`) and
    /// returns the answer's head; the body streams on.
    pub async fn post(
        &self,
        path: &str,
        body: Bytes,
        extra: &[(&'static str, String)],
    ) -> Result<Response<Incoming>, UpstreamError> {
        let addr = self.addr.clone();
        let fut = async {
            let stream =
                TcpStream::connect(&self.addr)
                    .await
                    .map_err(|source| UpstreamError::Connect {
                        addr: addr.clone(),
                        source,
                    })?;
            let _ = stream.set_nodelay(true);
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|source| UpstreamError::Http {
                    addr: addr.clone(),
                    source,
                })?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            let mut req = Request::builder()
                .method(Method::POST)
                .uri(format!("{}{}", self.prefix, path))
                .header(HOST, &self.addr)
                .header(CONTENT_TYPE, "application/json");
            req = match self.flavor {
                Flavor::OpenAi => req.header("authorization", format!("Bearer {}", self.key)),
                Flavor::Anthropic => req.header("x-api-key", &self.key),
            };
            for (k, v) in extra {
                req = req.header(*k, v);
            }
            let req = req.body(Full::new(body)).expect("static header names");
            sender
                .send_request(req)
                .await
                .map_err(|source| UpstreamError::Http {
                    addr: addr.clone(),
                    source,
                })
        };
        tokio::time::timeout(self.timeout, fut)
            .await
            .map_err(|_| UpstreamError::Timeout {
                addr: self.addr.clone(),
                timeout: self.timeout,
            })?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let t = Duration::from_secs(1);
        let u = Upstream::new(Flavor::OpenAi, "http://127.0.0.1:9/api/", "k", t).unwrap();
        assert_eq!(
            (u.addr.as_str(), u.prefix.as_str()),
            ("127.0.0.1:9", "/api")
        );
        for bad in [
            "https://x:1",
            "http://",
            "http://host",
            "http://u@h:1",
            "ftp://h:1",
        ] {
            assert!(Upstream::new(Flavor::OpenAi, bad, "k", t).is_err(), "{bad}");
        }
    }
}
