//! The operator's upstream model endpoint: HTTP/1.1 (TLS for `https://`,
//! rustls with the operator's CA bundle), connections kept alive between
//! calls (keepalive.rs), the real key added here (callers never see it).

use crate::usage::Flavor;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
use std::path::Path;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::rustls;

/// Trust anchors for `https://` upstreams when the operator names none.
pub const DEFAULT_CA_BUNDLE: &str = hatchery_tls::SYSTEM_BUNDLE;

#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error(
        "upstream URL {0:?} must be http://host:port[/prefix] or https://host[:port][/prefix]"
    )]
    BadUrl(String),
    #[error("the upstream's trust")]
    Ca(#[from] hatchery_tls::TrustError),
    #[error("TLS with the upstream {addr}: {source}")]
    Tls {
        addr: String,
        #[source]
        source: std::io::Error,
    },
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
    /// What the Host header says (host:port, or the host alone for https
    /// on 443 by default).
    host_header: String,
    /// Path prefix before `/v1/...`, without a trailing slash.
    prefix: String,
    key: String,
    timeout: Duration,
    tls: Option<Tls>,
    idle: crate::keepalive::Idle,
}

#[derive(Clone)]
struct Tls {
    connector: tokio_rustls::TlsConnector,
    name: rustls::pki_types::ServerName<'static>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tls({:?})", self.name)
    }
}

impl Upstream {
    /// `https://` upstreams trust [`DEFAULT_CA_BUNDLE`].
    pub fn new(
        flavor: Flavor,
        url: &str,
        key: &str,
        timeout: Duration,
    ) -> Result<Self, UpstreamError> {
        Self::with_ca(flavor, url, key, timeout, None)
    }

    /// As [`Upstream::new`], with `https://` trusting `ca_file` (PEM).
    pub fn with_ca(
        flavor: Flavor,
        url: &str,
        key: &str,
        timeout: Duration,
        ca_file: Option<&Path>,
    ) -> Result<Self, UpstreamError> {
        let bad = || UpstreamError::BadUrl(url.into());
        let (rest, https) = match (url.strip_prefix("http://"), url.strip_prefix("https://")) {
            (Some(r), _) => (r, false),
            (_, Some(r)) => (r, true),
            _ => return Err(bad()),
        };
        let (authority, prefix) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        if authority.is_empty() || authority.contains('@') || authority.starts_with(':') {
            return Err(bad());
        }
        // host[:port]; plain http must name its port (as before).
        let (host, addr) = match authority.rsplit_once(':') {
            Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p != 0) => {
                (h.to_string(), authority.to_string())
            }
            Some(_) => return Err(bad()),
            None if https => (authority.to_string(), format!("{authority}:443")),
            None => return Err(bad()),
        };
        let tls = if https {
            let cfg = hatchery_tls::client_config(ca_file.unwrap_or(Path::new(DEFAULT_CA_BUNDLE)))?;
            let bare = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let name = rustls::pki_types::ServerName::try_from(bare).map_err(|_| bad())?;
            Some(Tls {
                connector: tokio_rustls::TlsConnector::from(cfg),
                name,
            })
        } else {
            None
        };
        Ok(Upstream {
            flavor,
            host_header: authority.to_string(),
            addr,
            prefix: prefix.to_string(),
            key: key.to_string(),
            timeout,
            tls,
            idle: Default::default(),
        })
    }

    /// A new connection to the upstream, HTTP/1.1 handshake done.
    async fn connect(&self) -> Result<crate::keepalive::Sender, UpstreamError> {
        let addr = &self.addr;
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|source| UpstreamError::Connect {
                addr: addr.clone(),
                source,
            })?;
        let _ = stream.set_nodelay(true);
        match &self.tls {
            None => handshake(stream, addr).await,
            Some(t) => {
                let tls = t
                    .connector
                    .connect(t.name.clone(), stream)
                    .await
                    .map_err(|source| UpstreamError::Tls {
                        addr: addr.clone(),
                        source,
                    })?;
                handshake(tls, addr).await
            }
        }
    }

    /// Idle connections kept for reuse (tests).
    pub fn idle_connections(&self) -> usize {
        self.idle.len()
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
        let http = |source| UpstreamError::Http {
            addr: addr.clone(),
            source,
        };
        let fut = async {
            let mut req = Request::builder()
                .method(Method::POST)
                .uri(format!("{}{}", self.prefix, path))
                .header(HOST, &self.host_header)
                .header(CONTENT_TYPE, "application/json");
            req = match self.flavor {
                Flavor::OpenAi => req.header("authorization", format!("Bearer {}", self.key)),
                Flavor::Anthropic => req.header("x-api-key", &self.key),
            };
            for (k, v) in extra {
                req = req.header(*k, v);
            }
            let mut req = req.body(Full::new(body)).expect("static header names");
            if let Some(mut sender) = self.idle.take() {
                match sender.try_send_request(req).await {
                    Ok(resp) => {
                        self.idle.give_back_when_ready(sender);
                        return Ok(resp);
                    }
                    // Never sent (the upstream closed the idle connection):
                    // safe to send on a fresh one.
                    Err(mut e) => match e.take_message() {
                        Some(unsent) => req = unsent,
                        None => return Err(http(e.into_error())),
                    },
                }
            }
            let mut sender = self.connect().await?;
            let resp = sender.send_request(req).await.map_err(http)?;
            self.idle.give_back_when_ready(sender);
            Ok(resp)
        };
        tokio::time::timeout(self.timeout, fut)
            .await
            .map_err(|_| UpstreamError::Timeout {
                addr: self.addr.clone(),
                timeout: self.timeout,
            })?
    }
}

/// HTTP/1.1 over `io`; the connection is driven by its own task.
async fn handshake<S>(
    io: S,
    addr: &str,
) -> Result<hyper::client::conn::http1::SendRequest<Full<Bytes>>, UpstreamError>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|source| UpstreamError::Http {
            addr: addr.to_string(),
            source,
        })?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn urls() {
        let t = Duration::from_secs(1);
        let u = Upstream::new(Flavor::OpenAi, "http://127.0.0.1:9/api/", "k", t).unwrap();
        assert_eq!(
            (u.addr.as_str(), u.prefix.as_str()),
            ("127.0.0.1:9", "/api")
        );
        assert!(u.tls.is_none());
        let u = Upstream::new(Flavor::OpenAi, "http://[::1]:9/v1", "k", t).unwrap();
        assert_eq!(u.addr, "[::1]:9");
        for bad in [
            "http://",
            "https://",
            "https://:443",
            "https://h:0",
            "https://h:x",
            "https://u@h",
            "http://host",
            "http://u@h:1",
            "ftp://h:1",
        ] {
            assert!(Upstream::new(Flavor::OpenAi, bad, "k", t).is_err(), "{bad}");
        }
        let missing = Path::new("/nonexistent/ca.pem");
        assert!(matches!(
            Upstream::with_ca(Flavor::OpenAi, "https://h/v1", "k", t, Some(missing)),
            Err(UpstreamError::Ca(_))
        ));
        // http:// never reads a CA file.
        assert!(Upstream::with_ca(Flavor::OpenAi, "http://h:1", "k", t, Some(missing)).is_ok());
    }

    /// A loopback server answering every request on a connection with
    /// `body` (HTTP/1.1 keep-alive), counting the connections it accepted.
    async fn counting_server(body: &'static str) -> (String, Arc<AtomicUsize>) {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let accepted = Arc::new(AtomicUsize::new(0));
        let n = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (s, _) = l.accept().await.unwrap();
                n.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut r = BufReader::new(s);
                    loop {
                        let mut len = 0usize;
                        loop {
                            let mut line = String::new();
                            if r.read_line(&mut line).await.unwrap_or(0) == 0 {
                                return;
                            }
                            if let Some(v) =
                                line.to_ascii_lowercase().strip_prefix("content-length:")
                            {
                                len = v.trim().parse().unwrap();
                            }
                            if line == "\r\n" {
                                break;
                            }
                        }
                        let mut b = vec![0; len];
                        r.read_exact(&mut b).await.unwrap();
                        let head =
                            format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len());
                        let s = r.get_mut();
                        if s.write_all(head.as_bytes()).await.is_err()
                            || s.write_all(body.as_bytes()).await.is_err()
                        {
                            return;
                        }
                    }
                });
            }
        });
        (addr, accepted)
    }

    async fn read_all(r: Response<Incoming>) -> Bytes {
        use http_body_util::BodyExt;
        r.into_body().collect().await.unwrap().to_bytes()
    }

    /// Calls whose answers were read to the end share one connection; an
    /// answer dropped unread is not reused (its connection is closed), so
    /// the next call dials again and reads its own answer.
    #[tokio::test]
    async fn connections_are_kept_alive_only_after_a_whole_answer() {
        let (addr, accepted) = counting_server("{\"ok\":true}").await;
        let u = Upstream::new(
            Flavor::OpenAi,
            &format!("http://{addr}"),
            "k",
            Duration::from_secs(5),
        )
        .unwrap();
        let post = || u.post("/v1/chat/completions", Bytes::from_static(b"{}"), &[]);
        for _ in 0..3 {
            assert_eq!(&read_all(post().await.unwrap()).await[..], b"{\"ok\":true}");
            // The connection comes back from a task once it is ready.
            for _ in 0..100 {
                if u.idle_connections() == 1 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "one connection for three calls"
        );
        drop(post().await.unwrap());
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            u.idle_connections(),
            0,
            "a half-read answer's connection is not kept"
        );
        assert_eq!(&read_all(post().await.unwrap()).await[..], b"{\"ok\":true}");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }
}
