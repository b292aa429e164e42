//! Credential interception figures for `make bench` (issue 39), through
//! the daemon's own path: the egress proxy as `egress::start` serves it
//! (Unix socket, the relay's `PROXY` line, the session's pinned policy),
//! the secret read and unsealed from the `hatchery_secrets` store (SQLite
//! file, the real key file) on every injected request, and every use
//! written to the session's hash-chained log by the `Sessions` service
//! (`egress_credential` committed before the request goes out, with the
//! session-state check; `egress_credential_result` after the answer). One
//! database file, `hatchery.db` in a temp dir on disk, as the daemon has.
//!
//! In the same run, on loopback: the latency of an HTTPS GET on a
//! kept-alive connection through the plain tunnel and through
//! interception (p50 and p99 of each), and one large download each way.
//! Goals: ≤ 2 ms added at p50, ≥ 100 MiB/s for 128 MiB. At the end the
//! session's log must hold one use and one status per injected request and
//! its chain must verify, or the bench fails.
//! `cargo run --release -p hatchery-sessions --example intercept_bench -- [N] [MiB]`
//!
//! Not here (no sandbox): the guest's hop to the proxy (agent channel and
//! the daemon's relay), the same for both paths.

use bytes::Bytes;
use hatchery_db::Db;
use hatchery_egress::intercept::ca::{upstream_config, Ca};
use hatchery_egress::{CredentialSource, Interception, SourceError, Zeroizing};
use hatchery_policy::{DbPolicyStore, PolicyDocument, PolicyStore};
use hatchery_sessions::egress::{Binding, EgressConfig};
use hatchery_sessions::events::EventKind;
use hatchery_sessions::held_approvals::SessionApprovals;
use hatchery_sessions::store::{AgentSpec, DbSessionStore, SessionSpec, SessionStore, LOCAL_HOST};
use hatchery_sessions::{Sessions, SessionsConfig};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UnixStream};
use tokio_rustls::rustls;

const SESSION: &str = "ses_0123456789abcdef";
const SANDBOX: &str = "sbx_bench";
const SECRET: &str = "BENCH_TOKEN";

/// The daemon's reader of secret values (hatchery-agents' `SecretValues`,
/// private there): one store read and one unseal per injected request.
struct SecretValues(hatchery_secrets::Secrets);

#[async_trait::async_trait]
impl CredentialSource for SecretValues {
    async fn reveal(
        &self,
        tenant: Option<&str>,
        secret: &str,
    ) -> Result<Zeroizing<Vec<u8>>, SourceError> {
        Ok(self.0.reveal(tenant, secret).await?)
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A test CA (written to `dir/test-ca.pem`) and the origin's config.
fn origin_tls(dir: &Path) -> Arc<rustls::ServerConfig> {
    use rcgen::{BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name = DistinguishedName::new();
    p.distinguished_name.push(DnType::CommonName, "bench CA");
    let ca = p.self_signed(&ca_key).unwrap();
    std::fs::write(dir.join("test-ca.pem"), ca.pem()).unwrap();
    let key = KeyPair::generate().unwrap();
    let mut lp = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    lp.distinguished_name = DistinguishedName::new();
    lp.distinguished_name.push(DnType::CommonName, "127.0.0.1");
    let leaf = lp.signed_by(&key, &ca, &ca_key).unwrap();
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls_pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(cfg)
}

type Body = http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;

/// `/small`: 2 bytes; `/big?mib=N`: N MiB in 256 KiB frames. A request
/// to the bound origin without the injected header is answered 401, so a
/// credential that did not arrive fails the bench.
async fn origin(tls: Arc<rustls::ServerConfig>, want: Option<&'static str>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (s, _) = l.accept().await.unwrap();
            let _ = s.set_nodelay(true);
            let tls = tls.clone();
            tokio::spawn(async move {
                let Ok(s) = tokio_rustls::TlsAcceptor::from(tls).accept(s).await else {
                    return;
                };
                let svc = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| async move {
                        let auth = req.headers().get("authorization");
                        if want.is_some_and(|w| auth.is_none_or(|a| a.as_bytes() != w.as_bytes())) {
                            let mut r = hyper::Response::new(Full::new(Bytes::new()).boxed());
                            *r.status_mut() = hyper::StatusCode::UNAUTHORIZED;
                            return Ok::<_, std::convert::Infallible>(r);
                        }
                        let body: Body = if req.uri().path() == "/big" {
                            let mib: usize = req
                                .uri()
                                .query()
                                .and_then(|q| q.strip_prefix("mib="))
                                .and_then(|n| n.parse().ok())
                                .unwrap_or(1);
                            let chunk = Bytes::from(vec![7u8; 256 * 1024]);
                            let frames = (0..mib * 4).map(move |_| {
                                Ok::<_, std::convert::Infallible>(Frame::data(chunk.clone()))
                            });
                            StreamBody::new(futures::stream::iter(frames)).boxed()
                        } else {
                            Full::new(Bytes::from_static(b"ok")).boxed()
                        };
                        Ok(hyper::Response::new(body))
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    a
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// What the daemon's relay hands the proxy for a guest's connection (the
/// `PROXY` line naming the sandbox), then CONNECT, TLS trusting `roots`,
/// HTTP/1.1 over it.
async fn client(socket: &Path, port: u16, roots: &Path) -> Sender {
    let mut s = UnixStream::connect(socket).await.unwrap();
    s.write_all(
        format!("PROXY UNKNOWN {SANDBOX}\r\nCONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut b).await.unwrap();
        head.push(b[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    let cfg = upstream_config(roots).unwrap();
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let tls = tokio_rustls::TlsConnector::from(cfg)
        .connect(name, s)
        .await
        .unwrap();
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    send
}

async fn get(send: &mut Sender, path: &str) -> u64 {
    send.ready().await.unwrap();
    let req = hyper::Request::get(path)
        .header("host", "127.0.0.1")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let mut resp = send.send_request(req).await.unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
    let mut n = 0u64;
    while let Some(f) = resp.body_mut().frame().await {
        if let Ok(d) = f.unwrap().into_data() {
            n += d.len() as u64;
        }
    }
    n
}

fn pct(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1e3
}

fn spec(policy_id: &str, policy_version: u32) -> SessionSpec {
    SessionSpec {
        repo: "https://git.example/a.git".into(),
        git_ref: "main".into(),
        task: "t".into(),
        policy_id: policy_id.into(),
        policy_version,
        budget_tokens: 1,
        budget_usd_cents: 0,
        budget_wall_s: 3600,
        template: "code-interpreter".into(),
        agent: AgentSpec {
            kind: "reference".into(),
            model_url: "http://127.0.0.1:9100/v1".into(),
            model: "m".into(),
            max_steps: 1,
            command: None,
        },
        env: Default::default(),
        metadata: Default::default(),
        environment: None,
        tenant: None,
    }
}

/// The daemon's pieces over one database: the session store (with a
/// session on `doc`, unfinished), the secrets store (one sealed secret),
/// the policy store, the `Sessions` service (no runner is started: the
/// session is created in the store, so its sandboxes client is never
/// called but for the kernel-refusal poll, which fails fast), and the
/// proxy with the sandbox bound to the session.
async fn daemon(dir: &Path, doc: PolicyDocument) -> Arc<hatchery_sessions::egress::EgressLink> {
    let db = Db::sqlite(&dir.join("hatchery.db")).await.unwrap();
    let store = Arc::new(DbSessionStore::open(db.clone(), LOCAL_HOST).await.unwrap());
    let key = hatchery_secrets::SecretKey::load_or_create(&dir.join("secrets.key")).unwrap();
    let secrets = hatchery_secrets::Secrets::open(db.clone(), key)
        .await
        .unwrap();
    secrets
        .create(None, SECRET, "bench-token-0123456789")
        .await
        .unwrap();
    let policies = Arc::new(DbPolicyStore::open(db).await.unwrap());
    let pol = policies.create(doc, None).await.unwrap();
    store
        .create(SESSION, &spec(&pol.id, pol.version), None, "h")
        .await
        .unwrap();
    let sandboxes = hatchery_sessions::client_sandboxes::ClientSandboxes::new(
        hatchery_client::Client::new("http://127.0.0.1:1", "unused").unwrap(),
    );
    let sessions = Sessions::new(
        store,
        SessionsConfig::default(),
        Arc::new(hatchery_sessions::policy::BuiltinPolicies),
        Arc::new(sandboxes),
        Arc::new(hatchery_sessions::scheduler::LocalScheduler::new(1)),
    );
    let ix = Interception {
        ca: Arc::new(Ca::load_or_create(&dir.join("egress-ca")).unwrap()),
        upstream: upstream_config(&dir.join("test-ca.pem")).unwrap(),
        secrets: Arc::new(SecretValues(secrets)),
    };
    let link = hatchery_sessions::egress::start(
        &EgressConfig {
            guest_port: 3128,
            max_tunnels: 1024,
            max_per_session: 64,
            idle: Duration::from_secs(300),
            denied_interval: Duration::from_secs(10),
        },
        dir,
        sessions.clone(),
        policies,
        &prometheus::Registry::new(),
        Some(Arc::new(ix)),
        SessionApprovals::new(sessions),
    )
    .unwrap()
    .expect("the proxy is on");
    link.bind(
        SANDBOX,
        Binding {
            session: SESSION.into(),
            policy_id: pol.id,
            policy_version: pol.version,
            tenant: None,
        },
    );
    link
}

/// The session's credential events (uses, statuses) once `want` statuses
/// are in (a status may be written after its answer went back), and
/// whether its chain verifies.
async fn logged(db: &Path, want: usize) -> (usize, usize, bool) {
    let db = Db::sqlite(db).await.unwrap();
    let store = DbSessionStore::open(db.clone(), LOCAL_HOST).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let (uses, statuses) = loop {
        let (mut uses, mut statuses, mut after) = (0, 0, 0);
        loop {
            let evs = store.events(SESSION, after, 1000).await.unwrap();
            let Some(last) = evs.last() else { break };
            after = last.seq;
            for e in &evs {
                match &e.kind {
                    EventKind::EgressCredential { .. } => uses += 1,
                    EventKind::EgressCredentialResult { status: 200, .. } => statuses += 1,
                    _ => {}
                }
            }
        }
        if statuses >= want || Instant::now() > deadline {
            break (uses, statuses);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let audit = hatchery_sessions_schema::AuditReader::on(db).await.unwrap();
    let r = audit.verify(SESSION, &[]).await.unwrap();
    (uses, statuses, r.ok())
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(500);
    let mib: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(128);
    let dir = tempfile::tempdir().unwrap();
    let tls = origin_tls(dir.path());
    let bound = origin(tls.clone(), Some("Bearer bench-token-0123456789")).await;
    let plain = origin(tls, None).await;
    let doc: PolicyDocument = serde_json::from_value(serde_json::json!({"name": "bench", "rules": [
        {"id": "bound", "effect": "allow",
         "match": {"tools": ["egress"], "hosts": ["127.0.0.1"], "ports": [bound.port()]},
         "credential": {"secret": SECRET, "inject": {"header": {"name": "Authorization", "template": "Bearer {secret}"}}}},
        {"id": "plain", "effect": "allow",
         "match": {"tools": ["egress"], "hosts": ["127.0.0.1/32"], "ports": [plain.port()]}}
    ]}))
    .unwrap();
    let link = daemon(dir.path(), doc).await;

    let test_ca = dir.path().join("test-ca.pem");
    let mut tunnel = client(&link.socket, plain.port(), &test_ca).await;
    let ca = dir.path().join("egress-ca").join("ca.pem");
    let mut inter = client(&link.socket, bound.port(), &ca).await;
    // Warm both (leaf minted, connections up, statements prepared), then
    // interleave.
    const WARM: usize = 20;
    for _ in 0..WARM {
        get(&mut tunnel, "/small").await;
        get(&mut inter, "/small").await;
    }
    let (mut t, mut i) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let s = Instant::now();
        get(&mut tunnel, "/small").await;
        t.push(s.elapsed());
        let s = Instant::now();
        get(&mut inter, "/small").await;
        i.push(s.elapsed());
    }
    let (t50, t99) = (pct(&mut t, 0.5), pct(&mut t, 0.99));
    let (i50, i99) = (pct(&mut i, 0.5), pct(&mut i, 0.99));
    println!("egress intercept (daemon path: sealed secret read from SQLite, 2 chained session events per request, SQLite synchronous=FULL):");
    println!(
        "  {n} HTTPS GETs on a kept-alive connection: tunnel p50 {t50:.3} ms p99 {t99:.3} ms; intercepted p50 {i50:.3} ms p99 {i99:.3} ms"
    );
    println!(
        "  added: p50 {:.3} ms (goal <= 2 ms), p99 {:.3} ms",
        i50 - t50,
        i99 - t99
    );
    let path = format!("/big?mib={mib}");
    let s = Instant::now();
    let got = get(&mut tunnel, &path).await;
    let tt = s.elapsed();
    let s = Instant::now();
    let got2 = get(&mut inter, &path).await;
    let ti = s.elapsed();
    assert_eq!((got, got2), ((mib << 20) as u64, (mib << 20) as u64));
    println!(
        "  {mib} MiB download: tunnel {:.0} MiB/s, intercepted {:.0} MiB/s (goal >= 100 MiB/s)",
        mib as f64 / tt.as_secs_f64(),
        mib as f64 / ti.as_secs_f64()
    );
    let want = WARM + n + 1;
    let (uses, statuses, chain_ok) = logged(&dir.path().join("hatchery.db"), want).await;
    println!(
        "  session log: {uses} egress_credential, {statuses} egress_credential_result (200) for {want} injected requests; chain verifies: {chain_ok}"
    );
    assert!(
        uses == want && statuses == want && chain_ok,
        "the session log does not hold every use"
    );
}
