//! Host services inside every sandbox: a service on the host (a tool
//! broker, a model gateway, an egress proxy) that guest code reaches at
//! `127.0.0.1:GUEST_PORT` inside the guest. The agent listens there on
//! guest loopback and relays each accepted connection over its channel;
//! the daemon connects to the service's host address. The sandbox still
//! has no route to any host address.
//!
//! The host side attaches the sandbox's identity, so guest code cannot
//! forge it: it comes from which agent channel the connection arrived on,
//! never from anything the guest sends.
//!
//! - [`Identity::HttpHeader`] (the default): the connection is parsed as
//!   HTTP/1.1 and every request gets `X-Hatchery-Sandbox: <id>`, with any
//!   such header the guest sent removed first;
//! - [`Identity::ProxyV1`]: raw TCP, preceded by one PROXY protocol v1
//!   line, `PROXY UNKNOWN <id>\r\n` (receivers ignore what follows
//!   `UNKNOWN`; Hatchery-aware ones read the id from it).

use crate::agent_client::{AgentClient, Incoming};
use crate::metrics::RelayMetrics;
use crate::ratelimit::LogLimiter;
use crate::relay::{RelayStream, Slot};
use bytes::Bytes;
use hatchery_agent_proto::{Frame, Kind, RelayListen, RelayListening};
use http_body_util::{Either, Full};
use hyper::body::Incoming as Body;
use hyper::client::conn::http1::SendRequest;
use hyper::header::HeaderValue;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// The header that carries the sandbox id on HTTP host services.
pub use hatchery_serve::headers::SANDBOX_HEADER as IDENTITY_HEADER;
/// Guest-started connections open at once, per sandbox (the agent has the
/// same cap); more are refused.
pub const MAX_CONNECTIONS_PER_SANDBOX: usize = 64;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const LISTEN_TIMEOUT: Duration = Duration::from_secs(5);
/// Guest-started connections waiting for their service task: room for a
/// burst of the whole cap twice over; beyond that the guest is flooding.
const INCOMING_QUEUE: usize = 2 * MAX_CONNECTIONS_PER_SANDBOX;
const KIND: &str = "host_service";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostAddr {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl std::fmt::Display for HostAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostAddr::Tcp(a) => write!(f, "{a}"),
            HostAddr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// How the sandbox's identity reaches the service.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Identity {
    #[default]
    HttpHeader,
    ProxyV1,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostService {
    /// `[a-z0-9-]{1,32}`, unique.
    pub name: String,
    /// Where guest code connects: `127.0.0.1:guest_port` in the guest. Unique.
    pub guest_port: u16,
    pub addr: HostAddr,
    pub identity: Identity,
}

#[derive(Debug, thiserror::Error)]
pub enum HostServiceError {
    #[error("host service {0:?}: expected NAME=GUEST_PORT=HOST_ADDR[,identity=http|proxy]")]
    Syntax(String),
    #[error("host service name {0:?}: 1 to 32 of a-z, 0-9 and -")]
    Name(String),
    #[error("host service guest port {0:?}: a number from 1 to 65535")]
    Port(String),
    #[error("host service address {0:?}: IP:PORT (e.g. 127.0.0.1:9000) or unix:/absolute/path")]
    Addr(String),
    #[error("host service option {0:?}: the only option is identity=http or identity=proxy")]
    Option(String),
    #[error("host service {0} is already registered")]
    Duplicate(String),
    #[error("guest port {0} is already taken by host service {1}")]
    PortTaken(u16, String),
    #[error("no host service {0}")]
    NotFound(String),
}

impl FromStr for HostService {
    type Err = HostServiceError;

    /// `NAME=GUEST_PORT=HOST_ADDR[,identity=http|proxy]`, as the daemon's
    /// `--host-service` flag takes it.
    fn from_str(s: &str) -> Result<Self, HostServiceError> {
        let mut parts = s.splitn(3, '=');
        let (Some(name), Some(port), Some(rest)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(HostServiceError::Syntax(s.to_string()));
        };
        let mut opts = rest.split(',');
        let addr = opts.next().unwrap_or_default();
        let mut identity = Identity::default();
        for o in opts {
            identity = match o.trim() {
                "identity=http" => Identity::HttpHeader,
                "identity=proxy" => Identity::ProxyV1,
                other => return Err(HostServiceError::Option(other.to_string())),
            };
        }
        let svc = HostService {
            name: name.to_string(),
            guest_port: port
                .parse()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| HostServiceError::Port(port.to_string()))?,
            addr: parse_addr(addr)?,
            identity,
        };
        svc.validate()?;
        Ok(svc)
    }
}

fn parse_addr(a: &str) -> Result<HostAddr, HostServiceError> {
    if let Some(p) = a.strip_prefix("unix:") {
        let p = PathBuf::from(p);
        if p.is_absolute() && p.as_os_str().len() < 108 {
            return Ok(HostAddr::Unix(p));
        }
        return Err(HostServiceError::Addr(a.to_string()));
    }
    a.parse()
        .map(HostAddr::Tcp)
        .map_err(|_| HostServiceError::Addr(a.to_string()))
}

impl HostService {
    pub fn validate(&self) -> Result<(), HostServiceError> {
        let ok = !self.name.is_empty()
            && self.name.len() <= 32
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !ok {
            return Err(HostServiceError::Name(self.name.clone()));
        }
        if self.guest_port == 0 {
            return Err(HostServiceError::Port("0".into()));
        }
        Ok(())
    }
}

/// The registered services and what serving them needs; shared by every
/// sandbox's incoming-connection task.
pub(crate) struct Hub {
    by_port: RwLock<BTreeMap<u16, HostService>>,
    metrics: RelayMetrics,
    logs: LogLimiter,
    /// Agents to tell when the set changes.
    attached: std::sync::Mutex<Vec<Weak<AgentClient>>>,
}

impl Hub {
    pub(crate) fn new(metrics: RelayMetrics) -> Arc<Hub> {
        Arc::new(Hub {
            by_port: RwLock::new(BTreeMap::new()),
            metrics,
            logs: LogLimiter::new(Duration::from_secs(10), 5),
            attached: Default::default(),
        })
    }

    pub(crate) fn list(&self) -> Vec<HostService> {
        self.by_port
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    fn ports(&self) -> Vec<u16> {
        self.by_port
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .copied()
            .collect()
    }

    fn get(&self, port: u16) -> Option<HostService> {
        self.by_port
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&port)
            .cloned()
    }

    pub(crate) fn insert(&self, s: HostService) -> Result<(), HostServiceError> {
        s.validate()?;
        let mut all = self.by_port.write().unwrap_or_else(|p| p.into_inner());
        if all.values().any(|x| x.name == s.name) {
            return Err(HostServiceError::Duplicate(s.name));
        }
        if let Some(x) = all.get(&s.guest_port) {
            return Err(HostServiceError::PortTaken(s.guest_port, x.name.clone()));
        }
        all.insert(s.guest_port, s);
        Ok(())
    }

    pub(crate) fn remove(&self, name: &str) -> Result<HostService, HostServiceError> {
        let mut all = self.by_port.write().unwrap_or_else(|p| p.into_inner());
        let port = all
            .iter()
            .find(|(_, s)| s.name == name)
            .map(|(p, _)| *p)
            .ok_or_else(|| HostServiceError::NotFound(name.to_string()))?;
        Ok(all.remove(&port).expect("found above"))
    }

    /// Tells every attached agent the current set of ports (connections
    /// already relayed stay up).
    pub(crate) fn broadcast(&self) {
        let ports = self.ports();
        let mut attached = self.attached.lock().unwrap_or_else(|p| p.into_inner());
        attached.retain(|w| w.strong_count() > 0);
        for c in attached.iter().filter_map(Weak::upgrade) {
            let ch = c.open();
            c.send_later(Frame::json(
                ch.id,
                Kind::RelayListen,
                &RelayListen {
                    ports: ports.clone(),
                    reset: false,
                },
            ));
        }
    }

    /// A new agent connection of sandbox `sandbox`: reset its relays, have
    /// it listen for the current services, and serve what guest programs
    /// open to them.
    pub(crate) async fn attach(self: &Arc<Self>, client: &Arc<AgentClient>, sandbox: &str) {
        let (tx, rx) = mpsc::channel(INCOMING_QUEUE);
        client.set_incoming(tx);
        tokio::spawn(serve_incoming(
            Arc::clone(self),
            Arc::downgrade(client),
            sandbox.to_string(),
            rx,
        ));
        {
            let mut attached = self.attached.lock().unwrap_or_else(|p| p.into_inner());
            attached.retain(|w| w.strong_count() > 0);
            attached.push(Arc::downgrade(client));
        }
        let mut ch = client.open();
        let req = RelayListen {
            ports: self.ports(),
            reset: true,
        };
        if client
            .send(&Frame::json(ch.id, Kind::RelayListen, &req))
            .await
            .is_err()
        {
            return;
        }
        let key = format!("{sandbox}/listen");
        match tokio::time::timeout(LISTEN_TIMEOUT, ch.rx.recv()).await {
            Ok(Some(f)) if f.kind == Kind::Ok => match f.parse::<RelayListening>() {
                Ok(l) if l.failed.is_empty() => {}
                Ok(l) => {
                    let failed: Vec<String> = l
                        .failed
                        .iter()
                        .take(8)
                        .map(|(p, e)| format!("{p}: {}", truncate(e, 120)))
                        .collect();
                    crate::limited_warn!(self.logs, &key, sandbox = %sandbox, ?failed, "host service listeners not bound in the guest")
                }
                Err(_) => {
                    crate::limited_warn!(self.logs, &key, sandbox = %sandbox, "malformed listener answer from the guest")
                }
            },
            _ => {
                crate::limited_warn!(self.logs, &key, sandbox = %sandbox, "the guest did not confirm its host service listeners")
            }
        }
    }
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

async fn serve_incoming(
    hub: Arc<Hub>,
    client: Weak<AgentClient>,
    sandbox: String,
    mut rx: mpsc::Receiver<Incoming>,
) {
    let identity: Arc<str> = sandbox.into();
    while let Some(inc) = rx.recv().await {
        let Some(c) = client.upgrade() else { break };
        let refuse = |reason: &str| {
            hub.metrics.reject(KIND, reason);
            c.send_later(Frame::new(inc.channel.id, Kind::RelayClose, vec![]));
        };
        let Some(svc) = hub.get(inc.port) else {
            refuse("no_service");
            continue;
        };
        let Some(slot) = Slot::try_take(&c.relays_in, MAX_CONNECTIONS_PER_SANDBOX) else {
            refuse("capacity");
            crate::limited_warn!(hub.logs, &format!("{identity}/host-cap"), sandbox = %identity, service = %svc.name,
                "host service connection refused: per-sandbox cap reached");
            continue;
        };
        let stream = RelayStream::new(&c, inc.channel, inc.credit, slot, hub.metrics.meters(KIND));
        let (hub, identity) = (Arc::clone(&hub), Arc::clone(&identity));
        tokio::spawn(async move {
            let res = match svc.identity {
                Identity::ProxyV1 => serve_proxy_v1(stream, &svc, &identity).await,
                Identity::HttpHeader => serve_http(stream, &svc, &identity).await,
            };
            if let Err(e) = res {
                hub.metrics.reject(KIND, "upstream");
                crate::limited_warn!(hub.logs, &format!("{identity}/host/{}", svc.name), sandbox = %identity,
                    service = %svc.name, addr = %svc.addr, error = %e, "host service connection failed");
            }
        });
    }
}

enum Upstream {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

async fn connect(addr: &HostAddr) -> std::io::Result<Upstream> {
    let fut = async {
        Ok(match addr {
            HostAddr::Tcp(a) => {
                let s = tokio::net::TcpStream::connect(a).await?;
                let _ = s.set_nodelay(true);
                Upstream::Tcp(s)
            }
            HostAddr::Unix(p) => Upstream::Unix(tokio::net::UnixStream::connect(p).await?),
        })
    };
    tokio::time::timeout(CONNECT_TIMEOUT, fut)
        .await
        .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
}

async fn serve_proxy_v1(
    mut guest: RelayStream,
    svc: &HostService,
    identity: &str,
) -> std::io::Result<()> {
    let line = format!("PROXY UNKNOWN {identity}\r\n");
    async fn run<S: AsyncRead + AsyncWrite + Unpin>(
        guest: &mut RelayStream,
        mut up: S,
        line: &[u8],
    ) -> std::io::Result<()> {
        up.write_all(line).await?;
        tokio::io::copy_bidirectional_with_sizes(guest, &mut up, 64 * 1024, 64 * 1024).await?;
        Ok(())
    }
    match connect(&svc.addr).await? {
        Upstream::Tcp(s) => run(&mut guest, s, line.as_bytes()).await,
        Upstream::Unix(s) => run(&mut guest, s, line.as_bytes()).await,
    }
}

async fn handshake<S>(io: S) -> Result<SendRequest<Body>, hyper::Error>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    Ok(sender)
}

async fn connect_http(addr: &HostAddr) -> Result<SendRequest<Body>, String> {
    let res = match connect(addr).await.map_err(|e| e.to_string())? {
        Upstream::Tcp(s) => handshake(s).await,
        Upstream::Unix(s) => handshake(s).await,
    };
    res.map_err(|e| e.to_string())
}

type Reply = Response<Either<Body, Full<Bytes>>>;

/// The guest's connection as HTTP/1.1: each request, with the identity
/// header set, goes to the service on one upstream connection (made again
/// if the service closed it).
async fn serve_http(guest: RelayStream, svc: &HostService, identity: &str) -> std::io::Result<()> {
    let id = HeaderValue::from_str(identity).map_err(std::io::Error::other)?;
    let upstream = Arc::new(tokio::sync::Mutex::new(None::<SendRequest<Body>>));
    let addr = svc.addr.clone();
    let name = svc.name.clone();
    let service = hyper::service::service_fn(move |req: Request<Body>| {
        let (id, upstream, addr, name) = (
            id.clone(),
            Arc::clone(&upstream),
            addr.clone(),
            name.clone(),
        );
        async move {
            let mut up = upstream.lock().await;
            if !matches!(up.as_ref(), Some(s) if !s.is_closed()) {
                match connect_http(&addr).await {
                    Ok(s) => *up = Some(s),
                    Err(e) => return Ok::<Reply, std::convert::Infallible>(error_reply(&name, &e)),
                }
            }
            let sender = up.as_mut().expect("connected above");
            // Whatever the guest claimed is replaced, after hop-by-hop
            // stripping (a guest's `Connection: x-hatchery-sandbox` would
            // otherwise remove the identity the relay had just set).
            let pin = Some((IDENTITY_HEADER, id));
            Ok(
                match crate::proxy::exchange_pinned(sender, req, pin).await {
                    Ok(resp) => resp.map(Either::Left),
                    Err(e) => {
                        *up = None;
                        error_reply(&name, &e.to_string())
                    }
                },
            )
        }
    });
    hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(guest), service)
        .with_upgrades()
        .await
        .map_err(std::io::Error::other)
}

/// What guest code sees when the service cannot be reached: a 502 with the
/// API's error shape (the address is the operator's, not shown).
fn error_reply(name: &str, _why: &str) -> Reply {
    let body = serde_json::json!({"error": {"code": "host_service_unavailable",
        "message": format!("host service {name} is not reachable")}});
    let mut r = Response::new(Either::Right(Full::new(Bytes::from(body.to_string()))));
    *r.status_mut() = StatusCode::BAD_GATEWAY;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_syntax() {
        let s: HostService = "gateway=8080=127.0.0.1:9000".parse().unwrap();
        assert_eq!(s.name, "gateway");
        assert_eq!(s.guest_port, 8080);
        assert_eq!(s.addr, HostAddr::Tcp("127.0.0.1:9000".parse().unwrap()));
        assert_eq!(s.identity, Identity::HttpHeader);
        let s: HostService = "broker=9000=unix:/run/broker.sock,identity=proxy"
            .parse()
            .unwrap();
        assert_eq!(s.addr, HostAddr::Unix("/run/broker.sock".into()));
        assert_eq!(s.identity, Identity::ProxyV1);
        for bad in [
            "gateway",
            "gateway=8080",
            "Gateway=8080=127.0.0.1:9000",
            "gw=0=127.0.0.1:9000",
            "gw=70000=127.0.0.1:9000",
            "gw=80=localhost:9000",
            "gw=80=unix:relative.sock",
            "gw=80=127.0.0.1:9000,identity=none",
        ] {
            assert!(bad.parse::<HostService>().is_err(), "{bad}");
        }
    }

    #[test]
    fn names_and_ports_are_unique() {
        let hub = Hub::new(crate::metrics::Metrics::new().relay);
        hub.insert("a=80=127.0.0.1:1".parse().unwrap()).unwrap();
        assert!(matches!(
            hub.insert("a=81=127.0.0.1:1".parse().unwrap()),
            Err(HostServiceError::Duplicate(_))
        ));
        assert!(matches!(
            hub.insert("b=80=127.0.0.1:1".parse().unwrap()),
            Err(HostServiceError::PortTaken(80, _))
        ));
        assert_eq!(hub.ports(), vec![80]);
        hub.remove("a").unwrap();
        assert!(hub.list().is_empty());
    }

    #[tokio::test]
    async fn attach_resets_and_registrations_reach_attached_agents() {
        use hatchery_agent_proto::relay::GUEST_CHANNEL_BIT;
        use hatchery_agent_proto::RelayIncoming;
        let (client, mut agent) = crate::relay::tests::pair();
        let metrics = crate::metrics::Metrics::new();
        let hub = Hub::new(metrics.relay.clone());
        hub.insert("a=9100=127.0.0.1:1".parse().unwrap()).unwrap();
        let (h, c) = (Arc::clone(&hub), Arc::clone(&client));
        let attach = tokio::spawn(async move { h.attach(&c, "sbx_x").await });
        let f = agent.recv().await;
        assert_eq!(f.kind, Kind::RelayListen);
        let want = RelayListen {
            ports: vec![9100],
            reset: true,
        };
        assert_eq!(f.parse::<RelayListen>().unwrap(), want);
        let ok = RelayListening {
            listening: vec![9100],
            failed: vec![],
        };
        agent.send(Frame::json(f.channel, Kind::Ok, &ok)).await;
        attach.await.unwrap();
        // Registered later: attached agents listen at once, relays kept.
        hub.insert("b=9200=127.0.0.1:1".parse().unwrap()).unwrap();
        hub.broadcast();
        let f = agent.recv().await;
        let want = RelayListen {
            ports: vec![9100, 9200],
            reset: false,
        };
        assert_eq!(f.parse::<RelayListen>().unwrap(), want);
        // A connection to a port no service has: refused and counted.
        let chan = GUEST_CHANNEL_BIT | 7;
        let inc = RelayIncoming { port: 9300 };
        agent
            .send(Frame::json(chan, Kind::RelayIncoming, &inc))
            .await;
        let f = agent.recv().await;
        assert_eq!((f.channel, f.kind), (chan, Kind::RelayClose));
        let text = metrics.render();
        assert!(
            text.contains(
                r#"hatchery_relay_rejected_total{kind="host_service",reason="no_service"} 1"#
            ),
            "{text}"
        );
    }
}
