//! Credential injection (docs/policy.md, "Credentials"): for a CONNECT to
//! a destination that a credential rule of the session's policy names, the
//! proxy ends the guest's TLS with a leaf from the deployment's CA
//! ([`ca`]), opens its own TLS to the real destination (verified against
//! the host's trust store or a configured bundle), and relays HTTP/1.1
//! request by request. A request whose method and path a rule's binding
//! names gets the secret ([`inject`]), after its use is recorded in the
//! session's log ([`Events::credential`]); its status is recorded when the
//! answer comes. Answers, redirects included, go back as they are: the
//! proxy never follows a redirect, so a secret goes only to the host the
//! guest connected to. When a `require_approval` rule decided the
//! destination, each request first waits for a person's decision
//! ([`held`]). Destinations without a credential rule never come here (a
//! plain tunnel).

pub mod ca;
mod held;
pub mod inject;
mod io;

pub(crate) use held::RequestHold;

pub use io::Prefixed;

pub use crate::events::{CredentialResult, CredentialUse};
use crate::events::{EventSink, Limits, SessionId, SourceError};
use bytes::Bytes;
use hatchery_policy::Credential;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use io::Counted;
use rustls_pki_types::ServerName;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::rustls;
use zeroize::Zeroizing;

/// The secret values, read when a request gets one (the daemon's secrets
/// store; tests use a map). `tenant` is the session's (`None`: the
/// operator's): a value is read among that owner's secrets only.
#[async_trait::async_trait]
pub trait CredentialSource: Send + Sync + 'static {
    async fn reveal(
        &self,
        tenant: Option<&str>,
        secret: &str,
    ) -> Result<Zeroizing<Vec<u8>>, SourceError>;
}

/// What the proxy needs to intercept: the CA the guest trusts, the TLS
/// client configuration towards real upstreams, and the secrets.
pub struct Interception {
    pub ca: Arc<ca::Ca>,
    pub upstream: Arc<rustls::ClientConfig>,
    pub secrets: Arc<dyn CredentialSource>,
}

/// One intercepted connection's facts.
pub(crate) struct Plan {
    pub session: SessionId,
    pub connect_seq: u64,
    pub host: String,
    pub port: u16,
    pub policy_version: Option<u32>,
    pub credentials: Vec<Credential>,
    /// False only for a `scheme: "http"` binding (loopback test hosts).
    pub tls: bool,
    /// Whose secrets are read: the session's tenant (`None`: the operator).
    pub tenant: Option<String>,
    /// The guest's end and the address dialled (for refusal events).
    pub peer: std::net::SocketAddr,
    pub ip: std::net::IpAddr,
    /// A `require_approval` rule decided the destination: each request
    /// waits for a decision before it goes upstream.
    pub hold: Option<RequestHold>,
}

pub(crate) type Body = BoxBody<Bytes, hyper::Error>;

pub(crate) fn text(status: StatusCode, msg: String) -> Response<Body> {
    let mut r = Response::new(
        Full::new(Bytes::from(msg + "\n"))
            .map_err(|never| match never {})
            .boxed(),
    );
    *r.status_mut() = status;
    r.headers_mut().insert(
        "x-hatchery-egress",
        hyper::header::HeaderValue::from_static("refused"),
    );
    r
}

/// The destination's side of an intercepted connection.
pub(crate) enum Upstream {
    /// Dialled by the proxy, after the connection's intent was recorded.
    Dialled(TcpStream),
    /// Each request waits for a person's approval: the destination is
    /// dialled only when the first request has been approved, so nothing
    /// reaches it (not even a TCP or TLS handshake) before someone said
    /// yes. A denied or timed-out request leaves it undialled.
    OnApproval(SocketAddr),
}

/// Opens the proxy's connection to the destination: TLS verified against
/// the host's trust store (or the configured bundle) unless the binding
/// names a plain-HTTP test host, then HTTP/1.1.
#[derive(Clone)]
struct Connector {
    upstream: Arc<rustls::ClientConfig>,
    host: String,
    port: u16,
    tls: bool,
    timeout: Duration,
    up: Arc<AtomicU64>,
    down: Arc<AtomicU64>,
}

impl Connector {
    async fn open(&self, tcp: TcpStream) -> Result<Sender, String> {
        let tcp = Counted::with(tcp, self.up.clone(), self.down.clone());
        if !self.tls {
            return handshake(tcp, &self.host, self.port).await;
        }
        let name = ServerName::try_from(self.host.as_str())
            .map(|n| n.to_owned())
            .map_err(|_| format!("{} is not a TLS server name", self.host))?;
        let tls = tokio::time::timeout(
            self.timeout,
            tokio_rustls::TlsConnector::from(self.upstream.clone()).connect(name, tcp),
        )
        .await
        .map_err(|_| format!("TLS to {}:{} timed out", self.host, self.port))?
        .map_err(|e| format!("TLS to {}:{}: {e}", self.host, self.port))?;
        handshake(tls, &self.host, self.port).await
    }

    async fn dial_and_open(&self, addr: SocketAddr) -> Result<Sender, String> {
        let tcp = crate::dial::dial(addr, self.timeout).await;
        self.open(tcp.map_err(|(_, _, why)| why)?).await
    }
}

/// The connection's HTTP sender, opened at most once: at once for a
/// dialled destination, on the first approved request otherwise.
struct Link {
    sender: tokio::sync::OnceCell<Result<Sender, String>>,
    later: Option<(Connector, SocketAddr)>,
}

impl Link {
    async fn sender(&self) -> Result<Sender, String> {
        self.sender
            .get_or_init(|| async {
                match &self.later {
                    Some((c, addr)) => c.dial_and_open(*addr).await,
                    None => Err("no connection to the destination".into()),
                }
            })
            .await
            .clone()
    }
}

/// Serves one intercepted connection until either side closes; returns the
/// bytes moved to the destination and back (TLS records included).
pub(crate) async fn serve<C>(
    ix: &Interception,
    events: &EventSink,
    limits: &Limits,
    client: C,
    upstream: Upstream,
    plan: Plan,
) -> (u64, u64)
where
    C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let c = Connector {
        upstream: ix.upstream.clone(),
        host: plan.host.clone(),
        port: plan.port,
        tls: plan.tls,
        timeout: limits.connect_timeout,
        up: Arc::default(),
        down: Arc::default(),
    };
    let (up, down) = (c.up.clone(), c.down.clone());
    let moved = || (up.load(Ordering::Relaxed), down.load(Ordering::Relaxed));
    // A dialled destination first: when it cannot be verified, the guest
    // is told so in an HTTP answer rather than by a broken handshake.
    let link = match upstream {
        Upstream::Dialled(tcp) => Link {
            sender: tokio::sync::OnceCell::new_with(Some(c.open(tcp).await)),
            later: None,
        },
        Upstream::OnApproval(addr) => Link {
            sender: tokio::sync::OnceCell::new(),
            later: Some((c, addr)),
        },
    };
    if !plan.tls {
        // A loopback test host a `scheme: "http"` binding names: the
        // guest's forwarded request is replayed into the same relay.
        relay(client, link, plan, events, ix, limits).await;
        return moved();
    }
    let server = match ix.ca.server_config(&plan.host) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %hatchery_serve::error_text::with_causes(&e), host = %plan.host, "no leaf certificate");
            return moved();
        }
    };
    let accepted = tokio::time::timeout(
        limits.head_timeout,
        tokio_rustls::TlsAcceptor::from(server).accept(client),
    )
    .await;
    let tls = match accepted {
        Ok(Ok(t)) => t,
        // The guest did not trust the leaf or hung up: nothing was sent.
        _ => return moved(),
    };
    relay(tls, link, plan, events, ix, limits).await;
    moved()
}

type Sender = Arc<tokio::sync::Mutex<hyper::client::conn::http1::SendRequest<Body>>>;

async fn handshake<U>(upstream: U, host: &str, port: u16) -> Result<Sender, String>
where
    U: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(upstream))
        .await
        .map_err(|e| format!("HTTP to {host}:{port}: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(Arc::new(tokio::sync::Mutex::new(sender)))
}

/// Serves the guest's requests on `stream` (its TLS, or the replayed
/// plain connection), each through [`forward`].
async fn relay<S>(
    stream: S,
    link: Link,
    plan: Plan,
    events: &EventSink,
    ix: &Interception,
    limits: &Limits,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let plan = Arc::new(plan);
    let events = events.clone();
    let secrets = ix.secrets.clone();
    let link = Arc::new(link);
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let (plan, events, secrets, link) =
            (plan.clone(), events.clone(), secrets.clone(), link.clone());
        async move {
            Ok::<_, std::convert::Infallible>(forward(req, &plan, &events, &*secrets, &link).await)
        }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.idle)
        .keep_alive(true)
        .serve_connection(TokioIo::new(stream), svc)
        .await;
}

/// One request: the credential added when a binding holds for it (after
/// its use is recorded), sent, and its answer passed back as it is.
async fn forward(
    req: Request<Incoming>,
    plan: &Plan,
    events: &EventSink,
    secrets: &dyn CredentialSource,
    link: &Link,
) -> Response<Body> {
    let (mut parts, body) = req.into_parts();
    let method = parts.method.as_str().to_string();
    let target = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    // Origin form only; the Host is the destination the guest connected to.
    parts.uri = match target.parse() {
        Ok(u) => u,
        Err(_) => return text(StatusCode::BAD_REQUEST, "bad request target".into()),
    };
    let authority = if plan.port == if plan.tls { 443 } else { 80 } {
        plan.host.clone()
    } else {
        format!("{}:{}", plan.host, plan.port)
    };
    match hyper::header::HeaderValue::from_str(&authority) {
        Ok(h) => {
            parts.headers.insert(hyper::header::HOST, h);
        }
        Err(_) => return text(StatusCode::BAD_REQUEST, "bad host".into()),
    }
    for h in ["proxy-authorization", "proxy-connection"] {
        parts.headers.remove(h);
    }
    // Held before anything of it (or its credential) goes upstream.
    if let Some(h) = &plan.hold {
        if let Err(refused) = held::approve(h, plan, events, &method, &target).await {
            return refused;
        }
    }
    // Opened here when it waited for this approval.
    let sender = match link.sender().await {
        Ok(s) => s,
        Err(why) => return text(StatusCode::BAD_GATEWAY, why),
    };
    let mut use_seqs = Vec::new();
    for c in inject::chosen(&plan.credentials, &method, &target) {
        let value = match secrets.reveal(plan.tenant.as_deref(), &c.secret).await {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(secret = %c.secret, error = %hatchery_serve::error_text::with_causes(&*e), "credential not available");
                return text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("the credential {:?} is not available", c.secret),
                );
            }
        };
        let path = target.split('?').next().unwrap_or("/").to_string();
        let u = CredentialUse {
            session: plan.session.clone(),
            connect_seq: plan.connect_seq,
            rule_id: c.rule_id.clone(),
            secret: c.secret.clone(),
            host: plan.host.clone(),
            port: plan.port,
            method: method.clone(),
            path,
            policy_version: plan.policy_version,
        };
        // Recorded before the request goes out: no use without a record.
        match events.credential(u).await {
            Ok(seq) => use_seqs.push(seq),
            Err(e) => {
                return text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!(
                        "the credential's use could not be recorded: {}",
                        hatchery_serve::error_text::with_causes(&*e)
                    ),
                )
            }
        }
        if let Err(e) = inject::inject(&c.inject, &value, &mut parts.headers, &mut parts.uri) {
            return text(StatusCode::SERVICE_UNAVAILABLE, e.to_string());
        }
    }
    let req = Request::from_parts(parts, body.boxed());
    let sent = {
        let mut s = sender.lock().await;
        match s.ready().await {
            Ok(()) => s.send_request(req).await,
            Err(e) => Err(e),
        }
    };
    let resp = match sent {
        Ok(r) => r.map(|b| b.boxed()),
        Err(e) => text(
            StatusCode::BAD_GATEWAY,
            format!("{}:{}: {e}", plan.host, plan.port),
        ),
    };
    for seq in use_seqs {
        events
            .credential_result(CredentialResult {
                session: plan.session.clone(),
                use_seq: seq,
                status: resp.status().as_u16(),
                reason: resp.status().canonical_reason().unwrap_or("").to_string(),
            })
            .await;
    }
    resp
}
