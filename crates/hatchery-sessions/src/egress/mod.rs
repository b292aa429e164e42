//! The egress proxy for session sandboxes (docs/sessions.md, "Egress").
//! One `hatchery-egress` proxy in the daemon, served on a Unix socket in the
//! data dir and registered (by the daemon) as the host service `egress`
//! with `identity=proxy`: every sandbox reaches it at
//! `127.0.0.1:GUEST_PORT`, and the daemon's relay writes
//! `PROXY UNKNOWN <sandbox id>` before the guest's first byte. That line
//! comes from the host side of the agent channel the connection arrived on,
//! so the guest cannot choose it; the socket is in the 0700 data dir, so
//! nothing else can connect and forge it. The sandbox is mapped to its
//! session (bound by the runner), whose pinned policy version decides;
//! every allowed connection's intent is a session event committed before
//! the dial, and every refusal is counted in one ([`events`]).
//!
//! Trusts: the relay's `PROXY` line (see above) and the bindings the
//! session runner makes; nothing the guest sends decides which session a
//! connection belongs to.
//! Held connections' questions: [`crate::held_approvals`].

pub mod coalesce;
pub mod events;
pub mod kernel;
mod proxy_line;
pub mod sandboxes;

use events::{EgressLog, SessionEvents};
use hatchery_egress::{Limits, PolicySource, Proxy, SessionPolicy};
use hatchery_policy::cache::CompiledPolicies;
use hatchery_policy::Policy;
use sandboxes::{pseudo_session, sandbox_of};
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::BufReader;

/// The proxy's settings (the daemon maps its `--egress-*` flags here).
#[derive(Debug, Clone, PartialEq)]
pub struct EgressConfig {
    /// Where guest code reaches the proxy (`127.0.0.1:PORT` in the
    /// sandbox); 0 turns the proxy off.
    pub guest_port: u16,
    /// Tunnels open at once, in all.
    pub max_tunnels: usize,
    /// Tunnels open at once per session.
    pub max_per_session: usize,
    /// A tunnel carrying no byte either way for this long is closed.
    pub idle: Duration,
    /// One `egress_denied` event per source and destination per this long
    /// (the refusals in between are in its count).
    pub denied_interval: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    /// The proxy's Unix socket in the data dir could not be bound.
    #[error("egress proxy socket {}", .0.display())]
    Socket(PathBuf, #[source] std::io::Error),
}

/// What the proxy knows of a sandbox: its session and pinned policy.
#[derive(Debug, Clone, PartialEq)]
pub struct Binding {
    pub session: String,
    pub policy_id: String,
    pub policy_version: u32,
    /// The session's tenant (`None`: the operator's): the secrets its
    /// policy's credential rules name are read among this owner's only.
    pub tenant: Option<String>,
}

/// The running proxy, as the session hooks use it.
pub struct EgressLink {
    pub guest_port: u16,
    pub socket: PathBuf,
    /// The interception CA's certificate (PEM) when the proxy injects
    /// credentials: every session sandbox trusts it.
    pub ca_pem: Option<String>,
    compiled: Arc<CompiledPolicies>,
    bindings: Arc<Mutex<HashMap<String, Binding>>>,
    owned: Owned,
    events: Arc<SessionEvents>,
    approvals: Arc<crate::held_approvals::SessionApprovals>,
}

/// Sessionless sandboxes (E2B's header transforms) and the policy each
/// was bound with ([`sandboxes`]).
type Owned = Arc<Mutex<HashMap<String, Arc<Policy>>>>;

fn owned_lock(o: &Owned) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Policy>>> {
    o.lock().unwrap_or_else(|p| p.into_inner())
}

impl EgressLink {
    pub fn bind(&self, sandbox: &str, b: Binding) {
        self.events.track_sandbox(sandbox);
        self.lock().insert(sandbox.to_string(), b);
    }
    /// Forgets the sandbox and writes the refusals its session counted
    /// and has not written yet (the session ended, went idle or moved).
    pub async fn unbind(&self, sandbox: &str) {
        let gone = self.lock().remove(sandbox);
        if let Some(b) = gone {
            // The sandbox is still there (it is deleted after this): what
            // the kernel refused since the last tick is counted first.
            self.events.poll_kernel(sandbox, &b.session, true).await;
            self.events.forget_sandbox(sandbox);
            self.events.flush_session(&b.session).await;
            self.approvals.forget(&b.session);
        }
    }
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Binding>> {
        self.bindings.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Binds a sandbox that has no session to a policy of its own (E2B's
    /// header transforms): its connections are decided by `policy` and
    /// recorded in the daemon's log ([`sandboxes`]). Binding again
    /// replaces the policy (the sandbox's egress options changed).
    pub fn bind_sandbox(&self, sandbox: &str, policy: Arc<Policy>) {
        owned_lock(&self.owned).insert(sandbox.to_string(), policy);
    }

    /// Forgets a sandbox [`EgressLink::bind_sandbox`] bound: its
    /// connections are refused from now on.
    pub fn unbind_sandbox(&self, sandbox: &str) {
        owned_lock(&self.owned).remove(sandbox);
    }

    /// The placeholder variables the pinned policy's credential bindings
    /// name (`env`), each set to a value that is not the secret, for tools
    /// that insist on a variable being set.
    pub async fn placeholders(
        &self,
        policy_id: &str,
        version: u32,
    ) -> Result<Vec<(String, String)>, hatchery_policy::StoreError> {
        let p = self.compiled.get(policy_id, version).await?;
        Ok(p.credentials()
            .filter_map(|c| {
                let env = c.env.clone()?;
                Some((env, format!("hatchery-egress-injects-{}", c.secret)))
            })
            .collect())
    }
}

/// The session's pinned version, compiled (cached by id and version),
/// or a sessionless sandbox's own policy.
struct Pinned {
    bindings: Arc<Mutex<HashMap<String, Binding>>>,
    owned: Owned,
    compiled: Arc<CompiledPolicies>,
}

#[async_trait::async_trait]
impl PolicySource for Pinned {
    async fn policy_for(
        &self,
        session: &str,
    ) -> Result<SessionPolicy, hatchery_egress::SourceError> {
        if let Some(sbx) = sandbox_of(session) {
            let p = owned_lock(&self.owned).get(sbx).cloned();
            let policy = p.ok_or_else(|| PolicyLookup::NotBound(sbx.to_string()))?;
            // The E2B adapter stores a sandbox's header values as the
            // operator's (hatchery-agents e2b_headers).
            return Ok(SessionPolicy {
                policy,
                version: None,
                tenant: None,
            });
        }
        let b = self
            .bindings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .find(|b| b.session == session)
            .cloned()
            .ok_or_else(|| PolicyLookup::NotPinned(session.to_string()))?;
        let p = self.compiled.get(&b.policy_id, b.policy_version).await;
        let policy = p.map_err(|e| PolicyLookup::Store {
            id: b.policy_id,
            version: b.policy_version,
            source: e,
        })?;
        Ok(SessionPolicy {
            policy,
            version: Some(b.policy_version),
            tenant: b.tenant,
        })
    }
}

/// Why a session's pinned policy is not at hand.
#[derive(Debug, thiserror::Error)]
enum PolicyLookup {
    #[error("session {0} has no pinned policy on record")]
    NotPinned(String),
    #[error("sandbox {0} is no longer bound to a policy")]
    NotBound(String),
    #[error("policy {id} version {version}")]
    Store {
        id: String,
        version: u32,
        #[source]
        source: hatchery_policy::StoreError,
    },
}

/// Never consulted: every connection arrives identified (`handle_identified`).
struct Unused;

#[async_trait::async_trait]
impl hatchery_egress::Identify for Unused {
    async fn identify(&self, _: SocketAddr, _: SocketAddr) -> Option<String> {
        None
    }
}

/// How often bound sandboxes' kernel refusals are read (well under the
/// time the daemon's 256-entry list lasts at the kernel log's 20 a
/// second).
const KERNEL_POLL: Duration = Duration::from_secs(1);

/// Reads every bound sandbox's kernel refusals each [`KERNEL_POLL`], until
/// the proxy and its events are dropped.
fn poll_kernel(
    events: std::sync::Weak<SessionEvents>,
    bindings: Arc<Mutex<HashMap<String, Binding>>>,
) {
    tokio::spawn(async move {
        let mut t = tokio::time::interval(KERNEL_POLL);
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            t.tick().await;
            let Some(ev) = events.upgrade() else { break };
            let bound: Vec<(String, String)> = bindings
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .map(|(sbx, b)| (sbx.clone(), b.session.clone()))
                .collect();
            for (sbx, session) in bound {
                ev.poll_kernel(&sbx, &session, false).await;
            }
        }
    });
}

/// Serves the proxy on `DATA/egress.sock` (none when `guest_port` is 0),
/// its events going to `log`.
/// `interception`: the CA and secrets for credential rules (none: a
/// connection a credential rule names is refused). `approver`: who
/// decides connections `require_approval` rules hold
/// ([`crate::held_approvals::SessionApprovals`]).
pub fn start(
    a: &EgressConfig,
    data: &Path,
    log: Arc<dyn EgressLog>,
    policies: Arc<dyn hatchery_policy::PolicyStore>,
    registry: &prometheus::Registry,
    interception: Option<Arc<hatchery_egress::Interception>>,
    approver: Arc<crate::held_approvals::SessionApprovals>,
) -> Result<Option<Arc<EgressLink>>, EgressError> {
    if a.guest_port == 0 {
        return Ok(None);
    }
    let bindings: Arc<Mutex<HashMap<String, Binding>>> = Default::default();
    let owned: Owned = Default::default();
    let events = SessionEvents::start(log, registry, a.denied_interval);
    poll_kernel(Arc::downgrade(&events), bindings.clone());
    let sink: hatchery_egress::EventSink = Arc::new(sandboxes::Routed::new(events.clone()));
    let ca_pem = interception.as_ref().map(|i| i.ca.cert_pem().to_string());
    let compiled = Arc::new(CompiledPolicies::new(policies));
    let proxy = Proxy::with_interception(
        Arc::new(Unused),
        Arc::new(Pinned {
            bindings: bindings.clone(),
            owned: owned.clone(),
            compiled: compiled.clone(),
        }),
        sink,
        Limits {
            max_tunnels: a.max_tunnels,
            max_tunnels_per_session: a.max_per_session,
            idle: a.idle,
            ..Limits::default()
        },
        interception,
    );
    proxy.set_approver(approver.clone());
    let m = proxy.metrics();
    for c in [
        Box::new(m.connections.clone()) as Box<dyn prometheus::core::Collector>,
        Box::new(m.tunnels_open.clone()),
        Box::new(m.held.clone()),
        Box::new(m.bytes.clone()),
    ] {
        if let Err(e) = registry.register(c) {
            tracing::warn!(error = %e, "egress metrics not registered");
        }
    }
    let socket = data.join("egress.sock");
    let _ = std::fs::remove_file(&socket);
    let listener = tokio::net::UnixListener::bind(&socket)
        .map_err(|e| EgressError::Socket(socket.clone(), e))?;
    let (map, own) = (bindings.clone(), owned.clone());
    tokio::spawn(async move {
        loop {
            let (sock, _) = match listener.accept().await {
                Ok(x) => x,
                Err(e) => {
                    tracing::error!(error = %e, "egress listener failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let (proxy, map, own) = (proxy.clone(), map.clone(), own.clone());
            tokio::spawn(async move {
                // Buffered, so the line costs one read, not one per byte;
                // the proxy reads the rest through the same buffer.
                let mut sock = BufReader::new(sock);
                let line =
                    tokio::time::timeout(Duration::from_secs(5), proxy_line::read(&mut sock))
                        .await
                        .ok()
                        .flatten();
                let session = line.and_then(|sbx| {
                    let s = map
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get(&sbx)
                        .map(|b| b.session.clone());
                    s.or_else(|| {
                        owned_lock(&own)
                            .contains_key(&sbx)
                            .then(|| pseudo_session(&sbx))
                    })
                });
                // Relayed connections have no IP peer; events name the session.
                let peer = SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0));
                proxy.handle_identified(sock, peer, session).await;
            });
        }
    });
    tracing::info!(socket = %socket.display(), guest_port = a.guest_port, "egress proxy serving session sandboxes");
    Ok(Some(Arc::new(EgressLink {
        guest_port: a.guest_port,
        socket,
        ca_pem,
        compiled,
        bindings,
        owned,
        events,
        approvals: approver,
    })))
}
