//! Credential interception figures for `make bench`, on loopback, in one
//! run: the p50 latency of an HTTPS GET on a kept-alive connection through
//! the proxy's plain tunnel and through interception (the guest's TLS
//! ended, the credential added and its use recorded by a no-op sink,
//! a second TLS to the origin), and the throughput of one large download
//! each way. Goals (issue 39): ≤ 2 ms added at p50, ≥ 100 MiB/s for 128 MiB.
//! `cargo run --release -p hatchery-egress --example intercept_bench -- [N] [MiB]`

use bytes::Bytes;
use hatchery_egress::intercept::ca::{upstream_config, Ca};
use hatchery_egress::{
    CredentialResult, CredentialSource, CredentialUse, EgressEvent, EgressResult, Events, Identify,
    Interception, Limits, PolicySource, Proxy, SourceError, Zeroizing,
};
use hatchery_policy::{Policy, PolicyDocument};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls;

struct One;
#[async_trait::async_trait]
impl Identify for One {
    async fn identify(&self, _: SocketAddr, _: SocketAddr) -> Option<String> {
        Some("ses_bench".into())
    }
}
struct Fixed(Arc<Policy>);
#[async_trait::async_trait]
impl PolicySource for Fixed {
    async fn policy_for(&self, _: &str) -> Result<hatchery_egress::SessionPolicy, SourceError> {
        Ok(self.0.clone().into())
    }
}
struct Vault;
#[async_trait::async_trait]
impl CredentialSource for Vault {
    async fn reveal(&self, _: &str) -> Result<Zeroizing<Vec<u8>>, SourceError> {
        Ok(Zeroizing::new(b"bench-token".to_vec()))
    }
}
struct Sink;
#[async_trait::async_trait]
impl Events for Sink {
    async fn connect(&self, _: EgressEvent) -> Result<u64, SourceError> {
        Ok(1)
    }
    async fn result(&self, _: EgressResult) {}
    fn denied(&self, _: EgressEvent) {}
    async fn credential(&self, _: CredentialUse) -> Result<u64, SourceError> {
        Ok(2)
    }
    async fn credential_result(&self, _: CredentialResult) {}
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

/// `/small`: 2 bytes; `/big?mib=N`: N MiB in 256 KiB frames.
async fn origin(tls: Arc<rustls::ServerConfig>) -> SocketAddr {
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
                    |req: hyper::Request<hyper::body::Incoming>| async move {
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
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(body))
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

/// CONNECT through the proxy, TLS trusting `roots`, HTTP/1.1 over it.
async fn client(
    proxy: SocketAddr,
    port: u16,
    roots: &Path,
) -> hyper::client::conn::http1::SendRequest<Full<Bytes>> {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n").as_bytes())
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

async fn get(send: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>, path: &str) -> u64 {
    send.ready().await.unwrap();
    let req = hyper::Request::get(path)
        .header("host", "127.0.0.1")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let mut resp = send.send_request(req).await.unwrap();
    assert!(resp.status().is_success());
    let mut n = 0u64;
    while let Some(f) = resp.body_mut().frame().await {
        if let Ok(d) = f.unwrap().into_data() {
            n += d.len() as u64;
        }
    }
    n
}

fn p50(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(500);
    let mib: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(128);
    let dir = tempfile::tempdir().unwrap();
    let tls = origin_tls(dir.path());
    let (bound, plain) = (origin(tls.clone()).await, origin(tls).await);
    let doc: PolicyDocument = serde_json::from_value(serde_json::json!({"name": "bench", "rules": [
        {"id": "bound", "effect": "allow",
         "match": {"tools": ["egress"], "hosts": ["127.0.0.1"], "ports": [bound.port()]},
         "credential": {"secret": "T", "inject": {"header": {"name": "Authorization", "template": "Bearer {secret}"}}}},
        {"id": "plain", "effect": "allow",
         "match": {"tools": ["egress"], "hosts": ["127.0.0.1/32"], "ports": [plain.port()]}}
    ]}))
    .unwrap();
    let ca_dir = dir.path().join("egress-ca");
    let ix = Interception {
        ca: Arc::new(Ca::load_or_create(&ca_dir).unwrap()),
        upstream: upstream_config(&dir.path().join("test-ca.pem")).unwrap(),
        secrets: Arc::new(Vault),
    };
    let proxy = Proxy::with_interception(
        Arc::new(One),
        Arc::new(Fixed(Arc::new(Policy::compile(&doc).unwrap()))),
        Arc::new(Sink),
        Limits::default(),
        Some(Arc::new(ix)),
    );
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let paddr = l.local_addr().unwrap();
    tokio::spawn(proxy.serve(l));

    let mut tunnel = client(paddr, plain.port(), &dir.path().join("test-ca.pem")).await;
    let mut inter = client(paddr, bound.port(), &ca_dir.join("ca.pem")).await;
    // Warm both (leaf minted, connections up), then interleave.
    for _ in 0..20 {
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
    let (pt, pi) = (p50(t), p50(i));
    println!(
        "egress intercept: {n} HTTPS GETs on a kept-alive connection, p50 tunnel {:.3} ms, intercepted {:.3} ms, added {:.3} ms (goal <= 2 ms)",
        pt.as_secs_f64() * 1e3,
        pi.as_secs_f64() * 1e3,
        (pi.as_secs_f64() - pt.as_secs_f64()) * 1e3
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
        "egress intercept: {mib} MiB download, tunnel {:.0} MiB/s, intercepted {:.0} MiB/s (goal >= 100 MiB/s)",
        mib as f64 / tt.as_secs_f64(),
        mib as f64 / ti.as_secs_f64()
    );
}
