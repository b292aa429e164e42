//! The listener and per-connection logic. Order of checks, each failing
//! closed with a status and an event: tunnel cap → identity → request head
//! (size, time, syntax) → per-session cap → the session's pinned policy →
//! resolve → policy per resolved address (special ranges only by an
//! explicit CIDR/IP rule) → dial that exact address → relay with an idle
//! limit. The address dialled is the one the policy saw: no second lookup,
//! so no DNS rebinding between check and dial.

use crate::addr::special_range;
use crate::approval::{ApprovalAsk, Approver};
pub use crate::events::{
    EgressEvent, EgressResult, EventSink, Events, Limits, Outcome, SessionId, SourceError, Verdict,
};
use crate::intercept::{Interception, Plan};
use crate::target::{parse_request_line, Host, Request, Target};
use hatchery_policy::{Destination, Effect, Policy, EGRESS_TOOL};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// Who a connection comes from. Sessions implement it from the
/// sandbox-local endpoint the connection arrived on; the guest cannot
/// choose the answer.
#[async_trait::async_trait]
pub trait Identify: Send + Sync + 'static {
    async fn identify(&self, peer: SocketAddr, local: SocketAddr) -> Option<SessionId>;
}

/// The policy version a session is pinned to, compiled. An error fails the
/// connection closed.
#[async_trait::async_trait]
pub trait PolicySource: Send + Sync + 'static {
    async fn policy_for(&self, session: &str) -> Result<SessionPolicy, SourceError>;
}

/// A session's compiled policy and the version it is, when the source
/// knows: the version travels in the connection's intent event, so the log
/// can check in the same commit that it is still the session's.
#[derive(Clone)]
pub struct SessionPolicy {
    pub policy: Arc<Policy>,
    pub version: Option<u32>,
    /// Whose secrets the policy's credential rules name: the session's
    /// tenant (`None`: the operator's). The proxy reads values only there,
    /// so a tenant's session never gets another owner's secret of the
    /// same name, whatever its policy says.
    pub tenant: Option<String>,
}

impl From<Arc<Policy>> for SessionPolicy {
    fn from(policy: Arc<Policy>) -> Self {
        SessionPolicy {
            policy,
            version: None,
            tenant: None,
        }
    }
}

pub struct Proxy {
    identify: Arc<dyn Identify>,
    policies: Arc<dyn PolicySource>,
    events: EventSink,
    limits: Limits,
    tunnels: Arc<Semaphore>,
    per_session: Mutex<HashMap<SessionId, usize>>,
    metrics: crate::metrics::EgressMetrics,
    interception: Option<Arc<Interception>>,
    /// Asks a person about connections `require_approval` rules decide;
    /// without one they are refused (403).
    approver: OnceLock<Arc<dyn Approver>>,
}

struct Refusal {
    status: u16,
    reason: String,
    host: Option<String>,
    port: Option<u16>,
    ip: Option<IpAddr>,
    rule_id: Option<String>,
    policy_version: Option<u32>,
    approval_id: Option<String>,
}

fn refuse(status: u16, reason: impl Into<String>) -> Refusal {
    Refusal {
        status,
        reason: reason.into(),
        host: None,
        port: None,
        ip: None,
        rule_id: None,
        policy_version: None,
        approval_id: None,
    }
}

/// What the policy allowed: the exact address to dial and what to send
/// once it answers.
struct Decision {
    addr: SocketAddr,
    first: FirstBytes,
    /// The intent's fields (status 200, "allowed").
    ok: Refusal,
    /// A CONNECT to a destination credential rules name: intercepted
    /// instead of tunnelled.
    intercept: Option<Intercepted>,
    /// A `require_approval` rule decided: the connection waits for an
    /// approval before the dial.
    hold: Option<Hold>,
}

/// How a destination credential rules name is intercepted.
struct Intercepted {
    /// The bindings, in rule order.
    credentials: Vec<hatchery_policy::Credential>,
    /// Whether it is TLS (a CONNECT) or a forwarded plain request.
    tls: bool,
    /// Whose secrets the values are read from (the session's tenant).
    tenant: Option<String>,
}

/// What a held connection is asked about, beyond its host and port.
struct Hold {
    rule_id: String,
    timeout: Duration,
    /// A forwarded plain request's method and path (a CONNECT has none
    /// before the dial).
    request: Option<(String, String)>,
}

/// The address a rule let through, the rule, and its hold when it is a
/// `require_approval` one.
struct Chosen {
    addr: SocketAddr,
    rule_id: Option<String>,
    hold: Option<Duration>,
}

impl Proxy {
    pub fn new(
        identify: Arc<dyn Identify>,
        policies: Arc<dyn PolicySource>,
        events: EventSink,
        limits: Limits,
    ) -> Arc<Proxy> {
        Self::with_interception(identify, policies, events, limits, None)
    }

    /// A proxy that injects credentials (`interception`) for destinations
    /// that credential rules name; without it, a connection to one is
    /// refused (503), never tunnelled without its credential.
    pub fn with_interception(
        identify: Arc<dyn Identify>,
        policies: Arc<dyn PolicySource>,
        events: EventSink,
        limits: Limits,
        interception: Option<Arc<Interception>>,
    ) -> Arc<Proxy> {
        Arc::new(Proxy {
            interception,
            identify,
            policies,
            events,
            tunnels: Arc::new(Semaphore::new(limits.max_tunnels)),
            limits,
            per_session: Mutex::new(HashMap::new()),
            metrics: crate::metrics::EgressMetrics::new(),
            approver: OnceLock::new(),
        })
    }

    /// Who decides connections that `require_approval` rules hold; set
    /// once, before serving (a second call is ignored).
    pub fn set_approver(&self, approver: Arc<dyn Approver>) {
        let _ = self.approver.set(approver);
    }

    pub fn metrics(&self) -> &crate::metrics::EgressMetrics {
        &self.metrics
    }

    /// Accepts until the listener fails.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) -> std::io::Result<()> {
        loop {
            let (sock, peer) = listener.accept().await?;
            let _ = sock.set_nodelay(true);
            let me = self.clone();
            tokio::spawn(async move { me.handle(sock, peer).await });
        }
    }

    fn event(
        &self,
        verdict: Verdict,
        session: Option<&str>,
        peer: SocketAddr,
        r: &Refusal,
    ) -> EgressEvent {
        EgressEvent {
            verdict,
            session: session.map(str::to_string),
            peer,
            host: r.host.clone(),
            port: r.port,
            ip: r.ip,
            rule_id: r.rule_id.clone(),
            status: r.status,
            reason: r.reason.clone(),
            policy_version: r.policy_version,
            approval_id: r.approval_id.clone(),
        }
    }

    /// A refusal's event (never blocks).
    fn emit(&self, verdict: Verdict, session: Option<&str>, peer: SocketAddr, r: &Refusal) {
        self.count(verdict, r.status);
        let e = self.event(verdict, session, peer, r);
        self.events.denied(e);
    }

    fn count(&self, verdict: Verdict, status: u16) {
        let v = match verdict {
            Verdict::Allowed => "allowed",
            Verdict::Denied => "denied",
        };
        self.count_as(v, status)
    }

    /// `failed`: allowed and recorded, but the dial did not connect.
    fn count_as(&self, verdict: &str, status: u16) {
        self.metrics
            .connections
            .with_label_values(&[verdict, &status.to_string()])
            .inc();
    }

    async fn handle(self: Arc<Self>, mut sock: TcpStream, peer: SocketAddr) {
        let Ok(permit) = self.tunnels.clone().try_acquire_owned() else {
            let r = refuse(503, "too many tunnels on this proxy");
            self.emit(Verdict::Denied, None, peer, &r);
            answer(&mut sock, &r).await;
            return;
        };
        let local = sock.local_addr().unwrap_or(peer);
        let session = self.identify.identify(peer, local).await;
        self.run(sock, peer, session, permit).await
    }

    /// One connection whose session the caller already knows: the
    /// daemon's host-service relay names the sandbox it came from (never
    /// the guest), and the daemon maps that to a session. `None` (not a
    /// session's sandbox) is refused. `peer` is only for events.
    pub async fn handle_identified<S>(
        self: Arc<Self>,
        mut sock: S,
        peer: SocketAddr,
        session: Option<SessionId>,
    ) where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let Ok(permit) = self.tunnels.clone().try_acquire_owned() else {
            let r = refuse(503, "too many tunnels on this proxy");
            self.emit(Verdict::Denied, session.as_deref(), peer, &r);
            answer(&mut sock, &r).await;
            return;
        };
        self.run(sock, peer, session, permit).await
    }

    async fn run<S>(
        self: Arc<Self>,
        mut sock: S,
        peer: SocketAddr,
        session: Option<SessionId>,
        _permit: tokio::sync::OwnedSemaphorePermit,
    ) where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let Some(session) = session else {
            let r = refuse(403, "connection not from a known session");
            self.emit(Verdict::Denied, None, peer, &r);
            answer(&mut sock, &r).await;
            return;
        };
        // Counted from here, before anything is dialled: a session at its
        // cap makes no new upstream connection at all.
        let Some(_slot) = SessionSlot::take(&self, &session) else {
            let r = refuse(
                429,
                format!(
                    "session has {} tunnels open (the cap)",
                    self.limits.max_tunnels_per_session
                ),
            );
            self.emit(Verdict::Denied, Some(&session), peer, &r);
            answer(&mut sock, &r).await;
            return;
        };
        let mut d = match self.decide(&mut sock, &session).await {
            Ok(d) => d,
            Err(r) => {
                self.emit(Verdict::Denied, Some(&session), peer, &r);
                answer(&mut sock, &r).await;
                return;
            }
        };
        // An intercepted destination is asked about per request (the
        // proxy sees each one); any other connection here, as a whole.
        let mut request_hold = None;
        if let Some(hold) = d.hold.take() {
            match (&d.intercept, self.approver.get()) {
                (Some(_), Some(approver)) => {
                    d.ok.reason = format!(
                        "allowed; each request held for approval (rule {:?})",
                        hold.rule_id
                    );
                    request_hold = Some(crate::intercept::RequestHold {
                        rule_id: hold.rule_id,
                        timeout: hold.timeout,
                        approver: approver.clone(),
                        held: self.metrics.held.clone(),
                    });
                }
                _ => match self.held(&session, &d, hold).await {
                    Ok((reason, approval_id)) => {
                        d.ok.reason = reason;
                        d.ok.approval_id = Some(approval_id);
                    }
                    Err(r) => {
                        self.emit(Verdict::Denied, Some(&session), peer, &r);
                        answer(&mut sock, &r).await;
                        return;
                    }
                },
            }
        }
        // The intent is durable before the dial: a crash from here on
        // leaves an `egress_connect` without a result, never a connection
        // without a record.
        let e = self.event(Verdict::Allowed, Some(&session), peer, &d.ok);
        let intent = match self.events.connect(e).await {
            Ok(id) => id,
            Err(why) => {
                let r = Refusal {
                    status: 503,
                    reason: format!(
                        "the connection could not be recorded: {}",
                        hatchery_serve::error_text::with_causes(&*why)
                    ),
                    ..d.ok
                };
                self.emit(Verdict::Denied, Some(&session), peer, &r);
                answer(&mut sock, &r).await;
                return;
            }
        };
        let started = Instant::now();
        let result = |outcome: Outcome,
                      status: u16,
                      reason: String,
                      (bytes_up, bytes_down): (u64, u64)| EgressResult {
            session: session.clone(),
            intent,
            outcome,
            status,
            reason,
            bytes_up,
            bytes_down,
            duration: started.elapsed(),
        };
        // Each request of an intercepted destination waits for a person:
        // it is dialled on the first approved one (intercept::Upstream),
        // so nothing reaches it before that.
        let deferred =
            request_hold.is_some() && d.intercept.is_some() && self.interception.is_some();
        let dialled = if deferred {
            None
        } else {
            Some(crate::dial::dial(d.addr, self.limits.connect_timeout).await)
        };
        let dialled = match dialled.transpose() {
            Ok(u) => u,
            Err((outcome, status, reason)) => {
                self.count_as("failed", status);
                let r = Refusal {
                    status,
                    reason: reason.clone(),
                    ..d.ok
                };
                self.events
                    .result(result(outcome, status, reason, (0, 0)))
                    .await;
                answer(&mut sock, &r).await;
                return;
            }
        };
        self.count(Verdict::Allowed, d.ok.status);
        let mut moved = (0, 0);
        if let (
            Some(Intercepted {
                credentials,
                tls,
                tenant,
            }),
            Some(ix),
        ) = (d.intercept, self.interception.as_ref())
        {
            let reply = d.first.reply.unwrap_or_default();
            if sock.write_all(reply.as_bytes()).await.is_ok() {
                self.metrics.tunnels_open.inc();
                let plan = Plan {
                    session: session.clone(),
                    connect_seq: intent,
                    host: d.ok.host.clone().unwrap_or_default(),
                    port: d.addr.port(),
                    policy_version: d.ok.policy_version,
                    credentials,
                    tls,
                    tenant,
                    peer,
                    ip: d.addr.ip(),
                    hold: request_hold,
                };
                let client = crate::intercept::Prefixed::new(d.first.to_upstream, sock);
                let upstream = match dialled {
                    Some(tcp) => crate::intercept::Upstream::Dialled(tcp),
                    None => crate::intercept::Upstream::OnApproval(d.addr),
                };
                moved =
                    crate::intercept::serve(ix, &self.events, &self.limits, client, upstream, plan)
                        .await;
                self.metrics
                    .bytes
                    .with_label_values(&["up"])
                    .inc_by(moved.0);
                self.metrics
                    .bytes
                    .with_label_values(&["down"])
                    .inc_by(moved.1);
                self.metrics.tunnels_open.dec();
            }
            self.events
                .result(result(
                    Outcome::Connected,
                    200,
                    "closed (intercepted)".into(),
                    moved,
                ))
                .await;
            return;
        }
        // Only an intercepted destination is ever left undialled (above).
        let Some(mut upstream) = dialled else {
            return;
        };
        let sent = match d.first.reply {
            Some(reply) => sock.write_all(reply.as_bytes()).await.is_ok(),
            None => true,
        };
        if sent && upstream.write_all(&d.first.to_upstream).await.is_ok() {
            self.metrics.tunnels_open.inc();
            let (up, down) = pump(sock, upstream, self.limits.idle).await;
            self.metrics.bytes.with_label_values(&["up"]).inc_by(up);
            self.metrics.bytes.with_label_values(&["down"]).inc_by(down);
            self.metrics.tunnels_open.dec();
            moved = (up, down);
        }
        self.events
            .result(result(Outcome::Connected, 200, "closed".into(), moved))
            .await;
    }

    /// Waits for the approver's answer on a held connection: the intent's
    /// reason when approved, else the refusal (the answer is already in
    /// the session's log; the refusal's event counts it as a denial).
    async fn held(
        &self,
        session: &str,
        d: &Decision,
        hold: Hold,
    ) -> Result<(String, String), Refusal> {
        let refusal = |status, reason: String, approval_id: Option<&String>| Refusal {
            status,
            reason,
            host: d.ok.host.clone(),
            port: d.ok.port,
            ip: d.ok.ip,
            rule_id: Some(hold.rule_id.clone()),
            policy_version: d.ok.policy_version,
            approval_id: approval_id.cloned(),
        };
        let Some(approver) = self.approver.get() else {
            return Err(refusal(
                403,
                format!(
                    "rule {:?} requires an approval and this proxy asks no one",
                    hold.rule_id
                ),
                None,
            ));
        };
        let (method, path) = match hold.request {
            Some((m, p)) => (Some(m), Some(p)),
            None => (None, None),
        };
        let ask = ApprovalAsk {
            session: session.to_string(),
            host: d.ok.host.clone().unwrap_or_default(),
            port: d.addr.port(),
            method,
            path,
            per_request: false,
            rule_id: hold.rule_id.clone(),
            policy_version: d.ok.policy_version,
            timeout: hold.timeout,
        };
        self.metrics.held.inc();
        let answer = approver.ask(ask).await;
        self.metrics.held.dec();
        match crate::approval::decided(answer, hold.timeout, &hold.rule_id) {
            Ok((approval_id, false)) => {
                Ok((format!("allowed by approval {approval_id}"), approval_id))
            }
            Ok((approval_id, true)) => Ok((
                format!("allowed by approval {approval_id} (remembered for the session)"),
                approval_id,
            )),
            Err(r) => Err(refusal(r.status, r.why, r.approval_id.as_ref())),
        }
    }

    /// Everything up to the decision to dial (nothing dialled yet), or
    /// the refusal to answer.
    async fn decide<S: AsyncRead + Unpin>(
        &self,
        sock: &mut S,
        session: &str,
    ) -> Result<Decision, Refusal> {
        let (head, rest) = read_head(sock, &self.limits).await?;
        let text =
            std::str::from_utf8(&head).map_err(|_| refuse(400, "request head is not UTF-8"))?;
        let mut lines = text.split("\r\n");
        let line = lines.next().unwrap_or("");
        let req = parse_request_line(line).map_err(|e| refuse(400, e.to_string()))?;
        let target = match &req {
            Request::Connect(t) => t.clone(),
            Request::Forward { target, .. } => target.clone(),
        };
        let host_str = target.host.as_policy_str();
        let with_target = |mut r: Refusal| {
            r.host = Some(host_str.clone());
            r.port = Some(target.port);
            r
        };
        let policy = self.policies.policy_for(session).await.map_err(|e| {
            with_target(refuse(
                503,
                format!(
                    "policy unavailable: {}",
                    hatchery_serve::error_text::with_causes(&*e)
                ),
            ))
        })?;
        let version = policy.version;
        let Chosen {
            addr,
            rule_id,
            hold,
        } = self
            .choose(&policy.policy, &target, &host_str)
            .await
            .map_err(|mut r| {
                r.policy_version = version;
                with_target(r)
            })?;
        let hold = hold.map(|timeout| Hold {
            rule_id: rule_id.clone().unwrap_or_default(),
            timeout,
            request: match &req {
                Request::Connect(_) => None,
                Request::Forward { method, path, .. } => {
                    // The path without its query: a query may carry
                    // something the person deciding need not see.
                    let p = path.split('?').next().unwrap_or("/");
                    Some((method.to_string(), p.to_string()))
                }
            },
        });
        // A CONNECT is intercepted for `https` bindings, a forwarded
        // plain request for `http` ones (loopback test hosts only).
        let tls = matches!(req, Request::Connect(_));
        let want = if tls {
            hatchery_policy::Scheme::Https
        } else {
            hatchery_policy::Scheme::Http
        };
        let dest = Destination {
            host: &host_str,
            ip: Some(addr.ip()),
            port: target.port,
        };
        let creds: Vec<_> = policy
            .policy
            .credentials_for(&dest)
            .into_iter()
            .filter(|c| c.scheme == want)
            .cloned()
            .collect();
        let intercept = if creds.is_empty() {
            None
        } else if self.interception.is_none() {
            let mut r = refuse(
                503,
                "a credential rule names this destination and this proxy does not inject credentials",
            );
            r.policy_version = version;
            return Err(with_target(r));
        } else {
            Some(Intercepted {
                credentials: creds,
                tls,
                tenant: policy.tenant.clone(),
            })
        };
        if intercept.is_some() && !tls {
            // The guest's request as it came, replayed into the relay
            // that adds the credential.
            let mut raw = head.clone();
            raw.extend_from_slice(b"\r\n\r\n");
            raw.extend_from_slice(&rest);
            let ok = Refusal {
                status: 200,
                reason: "allowed".into(),
                host: Some(host_str.clone()),
                port: Some(target.port),
                ip: Some(addr.ip()),
                rule_id,
                policy_version: version,
                approval_id: None,
            };
            return Ok(Decision {
                addr,
                first: FirstBytes {
                    reply: None,
                    to_upstream: raw,
                },
                ok,
                intercept,
                hold,
            });
        }
        let first = match req {
            Request::Connect(_) => FirstBytes {
                reply: Some("HTTP/1.1 200 Connection Established\r\n\r\n".into()),
                to_upstream: rest,
            },
            Request::Forward { method, path, .. } => {
                let mut out = format!(
                    "{method} {path} HTTP/1.1\r\nHost: {}\r\n",
                    authority(&target)
                );
                for h in lines.filter(|l| !l.is_empty()) {
                    let name = h
                        .split(':')
                        .next()
                        .unwrap_or("")
                        .trim()
                        .to_ascii_lowercase();
                    // Hop-by-hop headers stop here; Host is the target's.
                    if matches!(
                        name.as_str(),
                        "host"
                            | "connection"
                            | "proxy-connection"
                            | "proxy-authorization"
                            | "keep-alive"
                            | "te"
                            | "upgrade"
                    ) {
                        continue;
                    }
                    out.push_str(h);
                    out.push_str("\r\n");
                }
                out.push_str("Connection: close\r\n\r\n");
                let mut bytes = out.into_bytes();
                bytes.extend_from_slice(&rest);
                FirstBytes {
                    reply: None,
                    to_upstream: bytes,
                }
            }
        };
        let ok = Refusal {
            status: 200,
            reason: "allowed".into(),
            host: Some(host_str.clone()),
            port: Some(target.port),
            ip: Some(addr.ip()),
            rule_id,
            policy_version: version,
            approval_id: None,
        };
        Ok(Decision {
            addr,
            first,
            ok,
            intercept,
            hold,
        })
    }

    /// Resolves (once) and picks the first address the policy allows.
    async fn choose(
        &self,
        policy: &Policy,
        target: &Target,
        host_str: &str,
    ) -> Result<Chosen, Refusal> {
        let ips: Vec<IpAddr> = match &target.host {
            Host::Ip(ip) => vec![*ip],
            Host::Name(name) => {
                let found = tokio::time::timeout(
                    self.limits.resolve_timeout,
                    tokio::net::lookup_host((name.as_str(), target.port)),
                )
                .await
                .map_err(|_| refuse(504, format!("resolving {name} timed out")))?
                .map_err(|e| refuse(502, format!("resolving {name}: {e}")))?;
                let mut v: Vec<IpAddr> = found.map(|a| a.ip()).collect();
                v.dedup();
                v
            }
        };
        let mut last = refuse(403, "no address");
        for ip in ips {
            let d = policy.evaluate(&hatchery_policy::Request {
                tool: EGRESS_TOOL,
                args: &serde_json::Value::Null,
                cost_cents: None,
                dest: Some(Destination {
                    host: host_str,
                    ip: Some(ip),
                    port: target.port,
                }),
                ctx: None,
            });
            let rule_id = d.rule_id.map(str::to_string);
            let hold = match d.effect {
                Effect::RequireApproval => d.rule_index.and_then(|i| policy.approval_timeout(i)),
                _ => None,
            };
            if d.effect == Effect::Allow || hold.is_some() {
                match special_range(ip) {
                    Some(range) if !d.matched_address_range => {
                        last = Refusal {
                            ip: Some(ip),
                            rule_id,
                            ..refuse(403, format!("{ip} is {range}; only a rule naming that address range allows it"))
                        };
                    }
                    _ => {
                        return Ok(Chosen {
                            addr: SocketAddr::new(ip, target.port),
                            rule_id,
                            hold,
                        })
                    }
                }
            } else {
                let why = match d.rule_id {
                    Some(id) => format!("denied by rule {id:?}"),
                    None => "no rule allows it (default deny)".into(),
                };
                last = Refusal {
                    ip: Some(ip),
                    rule_id,
                    ..refuse(403, why)
                };
            }
        }
        Err(last)
    }
}

struct FirstBytes {
    /// What the client gets before relaying starts (CONNECT's 200).
    reply: Option<String>,
    to_upstream: Vec<u8>,
}

fn authority(t: &Target) -> String {
    match &t.host {
        Host::Ip(IpAddr::V6(a)) => format!("[{a}]:{}", t.port),
        h => format!("{}:{}", h.as_policy_str(), t.port),
    }
}

/// Counts a session's open tunnels; released on drop.
struct SessionSlot<'a> {
    proxy: &'a Proxy,
    session: String,
}

impl<'a> SessionSlot<'a> {
    fn take(proxy: &'a Proxy, session: &str) -> Option<Self> {
        let mut m = proxy.per_session.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.entry(session.to_string()).or_insert(0);
        if *n >= proxy.limits.max_tunnels_per_session {
            return None;
        }
        *n += 1;
        Some(SessionSlot {
            proxy,
            session: session.to_string(),
        })
    }
}

impl Drop for SessionSlot<'_> {
    fn drop(&mut self) {
        let mut m = self
            .proxy
            .per_session
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.session) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.session);
            }
        }
    }
}

/// Reads until the blank line; returns the head (without it) and any bytes
/// that came after.
async fn read_head<S: AsyncRead + Unpin>(
    sock: &mut S,
    limits: &Limits,
) -> Result<(Vec<u8>, Vec<u8>), Refusal> {
    let mut buf = Vec::with_capacity(1024);
    let deadline = tokio::time::Instant::now() + limits.head_timeout;
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(i) = find(&buf, b"\r\n\r\n") {
            if i + 4 > limits.max_head_bytes {
                break;
            }
            let rest = buf.split_off(i + 4);
            buf.truncate(i);
            return Ok((buf, rest));
        }
        if buf.len() > limits.max_head_bytes {
            break;
        }
        let n = tokio::time::timeout_at(deadline, sock.read(&mut chunk))
            .await
            .map_err(|_| refuse(408, "request head not complete in time"))?
            .map_err(|e| refuse(400, format!("read: {e}")))?;
        if n == 0 {
            return Err(refuse(
                400,
                "connection closed before the request head ended",
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Err(refuse(
        431,
        format!("request head over {} bytes", limits.max_head_bytes),
    ))
}

fn find(h: &[u8], n: &[u8]) -> Option<usize> {
    h.windows(n.len()).position(|w| w == n)
}

async fn answer<S: AsyncWrite + Unpin>(sock: &mut S, r: &Refusal) {
    let phrase = match r.status {
        400 => "Bad Request",
        403 => "Forbidden",
        408 => "Request Timeout",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Error",
    };
    let body = format!("{}\n", r.reason);
    let resp = format!(
        "HTTP/1.1 {} {phrase}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\nX-Hatchery-Egress: denied\r\n\r\n{body}",
        r.status,
        body.len()
    );
    let _ = sock.write_all(resp.as_bytes()).await;
    let _ = sock.shutdown().await;
}

/// Relays both ways until both sides finish or nothing moves for `idle`;
/// returns the bytes moved (up, down).
async fn pump<A>(a: A, b: TcpStream, idle: Duration) -> (u64, u64)
where
    A: AsyncRead + AsyncWrite + Send + 'static,
{
    let start = Instant::now();
    let last = Arc::new(AtomicU64::new(0));
    let (ar, aw) = tokio::io::split(a);
    let (br, bw) = b.into_split();
    let (up_n, down_n) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let up = copy_half(ar, bw, last.clone(), start, up_n.clone());
    let down = copy_half(br, aw, last.clone(), start, down_n.clone());
    let watchdog = async {
        let tick = (idle / 4).max(Duration::from_millis(50));
        loop {
            tokio::time::sleep(tick).await;
            let since = start
                .elapsed()
                .saturating_sub(Duration::from_millis(last.load(Ordering::Relaxed)));
            if since > idle {
                return;
            }
        }
    };
    tokio::select! {
        _ = async { tokio::join!(up, down) } => {}
        _ = watchdog => {}
    }
    (up_n.load(Ordering::Relaxed), down_n.load(Ordering::Relaxed))
}

async fn copy_half<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    mut r: R,
    mut w: W,
    last: Arc<AtomicU64>,
    start: Instant,
    moved: Arc<AtomicU64>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if w.write_all(&buf[..n]).await.is_err() {
            break;
        }
        last.store(start.elapsed().as_millis() as u64, Ordering::Relaxed);
        moved.fetch_add(n as u64, Ordering::Relaxed);
    }
    let _ = w.shutdown().await;
}
