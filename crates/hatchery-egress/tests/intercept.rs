//! Credential injection end to end at the proxy: real curl through the
//! proxy to a TLS origin of the test's own on loopback (its certificate
//! from a test CA the proxy is told to trust), the guest side trusting
//! only the proxy's CA. Checks: the secret reaches the origin on matching
//! requests only, its use is recorded before the origin sees the request,
//! a redirect comes back as it is (never followed), a destination without
//! a credential rule is a plain tunnel (curl must trust the origin's own
//! CA there), and an origin the proxy cannot verify gets no request.

use bytes::Bytes;
use hatchery_egress::intercept::ca::{upstream_config, Ca};
use hatchery_egress::{
    Answer, ApprovalAsk, Approver, CredentialResult, CredentialSource, CredentialUse, EgressEvent,
    EgressResult, Events, Identify, Interception, Limits, PolicySource, Proxy, SourceError,
    Zeroizing,
};
use hatchery_policy::{Policy, PolicyDocument};
use http_body_util::Full;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use tokio::net::TcpListener;
use tokio_rustls::rustls;

const SECRET: &str = "tok-0123456789abcdef";

struct OneSession;

#[async_trait::async_trait]
impl Identify for OneSession {
    async fn identify(&self, _: SocketAddr, _: SocketAddr) -> Option<String> {
        Some("ses_1".into())
    }
}

struct Fixed(Arc<Policy>);

#[async_trait::async_trait]
impl PolicySource for Fixed {
    async fn policy_for(&self, _: &str) -> Result<hatchery_egress::SessionPolicy, SourceError> {
        Ok(self.0.clone().into())
    }
}

/// A tenant's session's policy: its secrets are read in the tenant.
struct OfTenant(Arc<Policy>, &'static str);

#[async_trait::async_trait]
impl PolicySource for OfTenant {
    async fn policy_for(&self, _: &str) -> Result<hatchery_egress::SessionPolicy, SourceError> {
        Ok(hatchery_egress::SessionPolicy {
            policy: self.0.clone(),
            version: None,
            tenant: Some(self.1.to_string()),
        })
    }
}

/// ten_a's TOKEN, a value of its own (the operator's is SECRET).
const TEN_A_SECRET: &str = "ten-a-own-token-value";

struct Vault;

#[async_trait::async_trait]
impl CredentialSource for Vault {
    async fn reveal(
        &self,
        tenant: Option<&str>,
        secret: &str,
    ) -> Result<Zeroizing<Vec<u8>>, SourceError> {
        match (tenant, secret) {
            (None, "TOKEN") => Ok(Zeroizing::new(SECRET.as_bytes().to_vec())),
            (Some("ten_a"), "TOKEN") => Ok(Zeroizing::new(TEN_A_SECRET.as_bytes().to_vec())),
            (t, other) => Err(format!("{t:?} has no secret {other}").into()),
        }
    }
}

/// One log both the proxy's events and the origin's requests go to, in
/// the order they happened.
#[derive(Default)]
struct Log(Mutex<Vec<String>>, Mutex<Vec<usize>>);

impl Log {
    fn push(&self, s: String) {
        self.0.lock().unwrap().push(s)
    }
    fn all(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
    /// An origin accepted a TCP connection: where in the log it fell.
    fn accepted(&self) {
        let at = self.0.lock().unwrap().len();
        self.1.lock().unwrap().push(at);
    }
    /// Log positions of the origins' accepted connections.
    fn accepts(&self) -> Vec<usize> {
        self.1.lock().unwrap().clone()
    }
}

struct Recorder(Arc<Log>);

#[async_trait::async_trait]
impl Events for Recorder {
    async fn connect(&self, e: EgressEvent) -> Result<u64, SourceError> {
        self.0.push(format!("connect {:?}:{:?}", e.host, e.port));
        Ok(1)
    }
    async fn result(&self, _: EgressResult) {}
    fn denied(&self, e: EgressEvent) {
        self.0.push(format!("denied {} {}", e.status, e.reason));
    }
    async fn credential(&self, u: CredentialUse) -> Result<u64, SourceError> {
        self.0.push(format!(
            "credential {} {} {} {}",
            u.secret, u.method, u.path, u.rule_id
        ));
        Ok(7)
    }
    async fn credential_result(&self, r: CredentialResult) {
        self.0
            .push(format!("credential_result {} {}", r.use_seq, r.status));
    }
}

/// A test CA and an origin's TLS config for 127.0.0.1 signed by it.
fn test_ca(dir: &Path) -> Arc<rustls::ServerConfig> {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name = rcgen::DistinguishedName::new();
    p.distinguished_name
        .push(rcgen::DnType::CommonName, "egress test CA");
    let ca = p.self_signed(&ca_key).unwrap();
    std::fs::write(dir.join("test-ca.pem"), ca.pem()).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let mut lp = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    lp.distinguished_name = rcgen::DistinguishedName::new();
    lp.distinguished_name
        .push(rcgen::DnType::CommonName, "127.0.0.1");
    let leaf = lp.signed_by(&leaf_key, &ca, &ca_key).unwrap();
    let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![leaf.der().clone()],
        rustls_pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
    )
    .unwrap();
    Arc::new(cfg)
}

/// An HTTPS origin: `/redirect` answers 302 to another host, everything
/// else 200 with the Authorization header and the target it saw.
async fn origin(tls: Arc<rustls::ServerConfig>, log: Arc<Log>) -> SocketAddr {
    origin_with(Some(tls), log).await
}

/// `tls: None`: plain HTTP.
async fn origin_with(tls: Option<Arc<rustls::ServerConfig>>, log: Arc<Log>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (s, _) = l.accept().await.unwrap();
            log.accepted();
            let (tls, log) = (tls.clone(), log.clone());
            tokio::spawn(async move {
                let s: Box<dyn Stream> = match tls {
                    Some(tls) => match tokio_rustls::TlsAcceptor::from(tls).accept(s).await {
                        Ok(t) => Box::new(t),
                        Err(_) => return,
                    },
                    None => Box::new(s),
                };
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let log = log.clone();
                    async move {
                        let auth = req
                            .headers()
                            .get("authorization")
                            .map(|v| v.to_str().unwrap_or("").to_string())
                            .unwrap_or_default();
                        let target = req.uri().to_string();
                        log.push(format!("origin {} {target} auth={auth}", req.method()));
                        let mut r = Response::new(Full::new(Bytes::from(format!(
                            "target={target} auth={auth}\n"
                        ))));
                        if req.uri().path().ends_with("/redirect") {
                            *r.status_mut() = hyper::StatusCode::FOUND;
                            r.headers_mut()
                                .insert("location", "https://127.0.0.2:9/steal".parse().unwrap());
                        }
                        Ok::<_, std::convert::Infallible>(r)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    addr
}

trait Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Stream for T {}

struct Setup {
    proxy: SocketAddr,
    origin: SocketAddr,
    plain: SocketAddr,
    log: Arc<Log>,
    dir: tempfile::TempDir,
}

async fn setup() -> Setup {
    setup_for(None).await
}

/// The proxy for one session, the operator's (`None`) or `tenant`'s.
async fn setup_for(tenant: Option<&'static str>) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let tls = test_ca(dir.path());
    let log = Arc::new(Log::default());
    let origin = origin(tls.clone(), log.clone()).await;
    // A second origin with the same certificate and no credential rule.
    let plain = self::origin(tls, log.clone()).await;
    let doc: PolicyDocument = serde_json::from_value(serde_json::json!({"name": "t", "rules": [
        {"id": "api-token", "effect": "allow",
         "match": {"tools": ["egress"], "hosts": ["127.0.0.1"], "ports": [origin.port()]},
         "credential": {"secret": "TOKEN", "methods": ["GET"], "path_prefix": "/api/",
                        "inject": {"header": {"name": "Authorization", "template": "Bearer {secret}"}}}},
        {"id": "plain", "effect": "allow",
         "match": {"tools": ["egress"], "hosts": ["127.0.0.1/32"], "ports": [plain.port()]}}
    ]}))
    .unwrap();
    let policy = Arc::new(Policy::compile(&doc).unwrap());
    let ix = Interception {
        ca: Arc::new(Ca::load_or_create(&dir.path().join("egress-ca")).unwrap()),
        upstream: upstream_config(&dir.path().join("test-ca.pem")).unwrap(),
        secrets: Arc::new(Vault),
    };
    let policies: Arc<dyn PolicySource> = match tenant {
        None => Arc::new(Fixed(policy)),
        Some(t) => Arc::new(OfTenant(policy, t)),
    };
    let proxy = Proxy::with_interception(
        Arc::new(OneSession),
        policies,
        Arc::new(Recorder(log.clone())),
        Limits::default(),
        Some(Arc::new(ix)),
    );
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(proxy.serve(l));
    Setup {
        proxy: addr,
        origin,
        plain,
        log,
        dir,
    }
}

/// curl through the proxy, trusting `ca`; (exit code, stdout, stderr).
async fn curl(s: &Setup, ca: &str, url: &str, extra: &[&str]) -> (i32, String, String) {
    let out = tokio::process::Command::new("curl")
        .args(["-sS", "--max-time", "10", "--proxy"])
        .arg(format!("http://{}", s.proxy))
        .arg("--cacert")
        .arg(s.dir.path().join(ca))
        .args(extra)
        .arg(url)
        .env_remove("HTTPS_PROXY")
        .env_remove("https_proxy")
        .output()
        .await
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_session_gets_its_tenants_secret_and_no_one_elses() {
    let ca = "egress-ca/ca.pem";
    // ten_a's session: its own TOKEN, never the operator's.
    let s = setup_for(Some("ten_a")).await;
    let url = format!("https://127.0.0.1:{}/api/x", s.origin.port());
    let (rc, out, err) = curl(&s, ca, &url, &[]).await;
    assert_eq!(rc, 0, "{err}");
    assert_eq!(
        out.trim(),
        format!("target=/api/x auth=Bearer {TEN_A_SECRET}")
    );
    // ten_b has no TOKEN: refused, with neither ten_a's nor the
    // operator's sent, and the origin never asked.
    let s = setup_for(Some("ten_b")).await;
    let url = format!("https://127.0.0.1:{}/api/x", s.origin.port());
    let (_, out, _) = curl(&s, ca, &url, &["-w", " %{http_code}"]).await;
    assert!(out.trim().ends_with(" 503"), "{out}");
    assert!(
        !out.contains(SECRET) && !out.contains(TEN_A_SECRET),
        "{out}"
    );
    let log = s.log.all();
    assert!(!log.iter().any(|l| l.starts_with("origin")), "{log:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_go_only_where_the_rule_says() {
    let s = setup().await;
    let base = format!("https://127.0.0.1:{}", s.origin.port());
    let ca = "egress-ca/ca.pem";

    // A matching request: the origin sees the secret; its use was
    // recorded before the origin saw the request.
    let (rc, out, err) = curl(
        &s,
        ca,
        &format!("{base}/api/repos?x=1"),
        &["-H", "Authorization: Bearer guest-guess"],
    )
    .await;
    assert_eq!(rc, 0, "{err}");
    assert_eq!(
        out.trim(),
        format!("target=/api/repos?x=1 auth=Bearer {SECRET}")
    );
    let log = s.log.all();
    let used = log
        .iter()
        .position(|l| l == "credential TOKEN GET /api/repos api-token")
        .expect("use recorded");
    let seen = log
        .iter()
        .position(|l| l.starts_with("origin GET /api/repos"))
        .unwrap();
    assert!(used < seen, "{log:?}");
    assert!(
        log.contains(&"credential_result 7 200".to_string()),
        "{log:?}"
    );
    // The event never holds the value.
    assert!(!log
        .iter()
        .filter(|l| !l.starts_with("origin"))
        .any(|l| l.contains(SECRET)));

    // Another path, another method: the guest's own header goes through,
    // no secret.
    let (_, out, _) = curl(&s, ca, &format!("{base}/other"), &[]).await;
    assert_eq!(out.trim(), "target=/other auth=");
    let (_, out, _) = curl(
        &s,
        ca,
        &format!("{base}/api/x"),
        &["-X", "POST", "-H", "Authorization: mine"],
    )
    .await;
    assert_eq!(out.trim(), "target=/api/x auth=mine");
    let (_, out, _) = curl(&s, ca, &format!("{base}/api/../other"), &["--path-as-is"]).await;
    assert_eq!(out.trim(), "target=/api/../other auth=");

    // A redirect comes back as it is; curl (not following) sees the 302.
    let (_, out, _) = curl(
        &s,
        ca,
        &format!("{base}/api/redirect"),
        &["-o", "/dev/null", "-w", "%{http_code} %{redirect_url}"],
    )
    .await;
    assert_eq!(out.trim(), "302 https://127.0.0.2:9/steal");
    // Following it, curl asks the proxy for 127.0.0.2:9, which no rule
    // allows: refused at the proxy before any dial.
    let before = s.log.all().len();
    let (rc, _, _) = curl(
        &s,
        ca,
        &format!("{base}/api/redirect"),
        &["-L", "-o", "/dev/null"],
    )
    .await;
    assert_ne!(rc, 0);
    let log = s.log.all();
    assert!(
        log[before..].iter().any(|l| l.starts_with("denied 403")),
        "{log:?}"
    );
    assert!(
        !log[before..].iter().any(|l| l.contains("/steal")),
        "{log:?}"
    );

    // No credential rule: a plain tunnel. curl must trust the origin's own
    // CA there (the proxy's CA fails), and the origin sees no secret.
    let plain = format!("https://127.0.0.1:{}/api/x", s.plain.port());
    let (rc, _, _) = curl(&s, ca, &plain, &[]).await;
    assert_ne!(rc, 0, "the plain tunnel presented the proxy's certificate");
    let (rc, out, err) = curl(&s, "test-ca.pem", &plain, &[]).await;
    assert_eq!(rc, 0, "{err}");
    assert_eq!(out.trim(), "target=/api/x auth=");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_the_proxy_cannot_verify_gets_nothing() {
    let s = setup().await;
    // The proxy trusts only its own CA now, not the origin's.
    let doc: PolicyDocument = serde_json::from_value(serde_json::json!({"name": "t", "rules": [
        {"id": "api-token", "effect": "allow",
         "match": {"tools": ["egress"], "hosts": ["127.0.0.1"], "ports": [s.origin.port()]},
         "credential": {"secret": "TOKEN", "inject": {"query": {"param": "token"}}}}
    ]}))
    .unwrap();
    let ix = Interception {
        ca: Arc::new(Ca::load_or_create(&s.dir.path().join("egress-ca")).unwrap()),
        upstream: upstream_config(&s.dir.path().join("egress-ca/ca.pem")).unwrap(),
        secrets: Arc::new(Vault),
    };
    let proxy = Proxy::with_interception(
        Arc::new(OneSession),
        Arc::new(Fixed(Arc::new(Policy::compile(&doc).unwrap()))),
        Arc::new(Recorder(s.log.clone())),
        Limits::default(),
        Some(Arc::new(ix)),
    );
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(proxy.serve(l));
    let s2 = Setup { proxy: addr, ..s };
    let url = format!("https://127.0.0.1:{}/api/x", s2.origin.port());
    let (_, out, _) = curl(&s2, "egress-ca/ca.pem", &url, &["-w", " %{http_code}"]).await;
    assert!(out.contains("502") && out.contains("certificate"), "{out}");
    let log = s2.log.all();
    assert!(!log.iter().any(|l| l.starts_with("origin GET")), "{log:?}");
    assert!(!log.iter().any(|l| l.starts_with("credential ")), "{log:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_rule_without_interception_is_refused() {
    let s = setup().await;
    let doc: PolicyDocument = serde_json::from_value(serde_json::json!({"name": "t", "rules": [
        {"id": "api-token", "effect": "allow",
         "match": {"tools": ["egress"], "hosts": ["127.0.0.1"], "ports": [s.origin.port()]},
         "credential": {"secret": "TOKEN", "inject": {"basic": {"username": "u"}}}}
    ]}))
    .unwrap();
    let proxy = Proxy::new(
        Arc::new(OneSession),
        Arc::new(Fixed(Arc::new(Policy::compile(&doc).unwrap()))),
        Arc::new(Recorder(s.log.clone())),
        Limits::default(),
    );
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(proxy.serve(l));
    let s2 = Setup { proxy: addr, ..s };
    let url = format!("https://127.0.0.1:{}/", s2.origin.port());
    let (rc, _, _) = curl(&s2, "test-ca.pem", &url, &[]).await;
    assert_ne!(rc, 0);
    assert!(
        s2.log.all().iter().any(|l| l.starts_with("denied 503")),
        "{:?}",
        s2.log.all()
    );
    assert!(!s2.log.all().iter().any(|l| l.starts_with("origin")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_injection_on_a_loopback_test_host() {
    let s = setup().await;
    let plain = origin_with(None, s.log.clone()).await;
    let doc: PolicyDocument = serde_json::from_value(serde_json::json!({"name": "t", "rules": [
        {"id": "loopback-token", "effect": "allow",
         "match": {"tools": ["egress"], "hosts": ["127.0.0.1"], "ports": [plain.port()]},
         "credential": {"secret": "TOKEN", "scheme": "http", "path_prefix": "/api/",
                        "inject": {"query": {"param": "token"}}}}
    ]}))
    .unwrap();
    let ix = Interception {
        ca: Arc::new(Ca::load_or_create(&s.dir.path().join("egress-ca")).unwrap()),
        upstream: upstream_config(&s.dir.path().join("test-ca.pem")).unwrap(),
        secrets: Arc::new(Vault),
    };
    let proxy = Proxy::with_interception(
        Arc::new(OneSession),
        Arc::new(Fixed(Arc::new(Policy::compile(&doc).unwrap()))),
        Arc::new(Recorder(s.log.clone())),
        Limits::default(),
        Some(Arc::new(ix)),
    );
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(proxy.serve(l));
    let s2 = Setup { proxy: addr, ..s };
    let base = format!("http://127.0.0.1:{}", plain.port());
    let (rc, out, err) = curl(
        &s2,
        "test-ca.pem",
        &format!("{base}/api/x?token=guest&a=1"),
        &[],
    )
    .await;
    assert_eq!(rc, 0, "{err}");
    assert_eq!(
        out.trim(),
        format!("target=/api/x?a=1&token={SECRET} auth=")
    );
    let (_, out, _) = curl(&s2, "test-ca.pem", &format!("{base}/other"), &[]).await;
    assert_eq!(out.trim(), "target=/other auth=");
    let log = s2.log.all();
    assert!(
        log.contains(&"credential TOKEN GET /api/x loopback-token".to_string()),
        "{log:?}"
    );
}

/// Answers by path (`/api/ok` approved, `/api/no` denied, anything else
/// timed out) and logs each question where the origin logs its requests.
struct ByPath(Arc<Log>);

#[async_trait::async_trait]
impl Approver for ByPath {
    async fn ask(&self, a: ApprovalAsk) -> Result<Answer, SourceError> {
        let (m, p) = (a.method.clone().unwrap(), a.path.clone().unwrap());
        self.0
            .push(format!("asked {m} {p} per_request={}", a.per_request));
        let approval_id = format!("apr_{}", p.trim_start_matches("/api/"));
        Ok(match p.as_str() {
            "/api/ok" => Answer::Approved {
                approval_id,
                remembered: false,
            },
            "/api/no" => Answer::Denied {
                approval_id,
                note: String::new(),
            },
            _ => Answer::TimedOut { approval_id },
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_intercepted_destination_is_approved_per_request() {
    let s = setup().await;
    let doc: PolicyDocument = serde_json::from_value(serde_json::json!({"name": "t", "rules": [
        {"id": "ask-api", "effect": "require_approval", "approval_timeout_s": 3,
         "match": {"tools": ["egress"], "hosts": ["127.0.0.1"], "ports": [s.origin.port()]}},
        {"id": "api-token", "effect": "allow",
         "match": {"tools": ["egress"], "hosts": ["127.0.0.1"], "ports": [s.origin.port()]},
         "credential": {"secret": "TOKEN", "path_prefix": "/api/",
                        "inject": {"header": {"name": "Authorization", "template": "Bearer {secret}"}}}}
    ]}))
    .unwrap();
    let ix = Interception {
        ca: Arc::new(Ca::load_or_create(&s.dir.path().join("egress-ca")).unwrap()),
        upstream: upstream_config(&s.dir.path().join("test-ca.pem")).unwrap(),
        secrets: Arc::new(Vault),
    };
    let proxy = Proxy::with_interception(
        Arc::new(OneSession),
        Arc::new(Fixed(Arc::new(Policy::compile(&doc).unwrap()))),
        Arc::new(Recorder(s.log.clone())),
        Limits::default(),
        Some(Arc::new(ix)),
    );
    proxy.set_approver(Arc::new(ByPath(s.log.clone())));
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(proxy.serve(l));
    let s2 = Setup { proxy: addr, ..s };
    let base = format!("https://127.0.0.1:{}", s2.origin.port());
    // Three requests on one connection: each asked about on its own; the
    // refused ones are the proxy's 403s, and the connection goes on.
    let (rc, out, err) = curl(
        &s2,
        "egress-ca/ca.pem",
        &format!("{base}/api/late"),
        &[
            "-w",
            "%{http_code}\n",
            &format!("{base}/api/no"),
            &format!("{base}/api/ok?q=1"),
        ],
    )
    .await;
    assert_eq!(rc, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        [
            "GET /api/no: denied by approval apr_no",
            "403",
            &format!("target=/api/ok?q=1 auth=Bearer {SECRET}"),
            "200",
            "GET /api/late: approval apr_late not decided within 3 s (rule \"ask-api\")",
            "403",
        ],
        "{out}"
    );
    let log = s2.log.all();
    let port = s2.origin.port();
    assert_eq!(
        log,
        [
            format!("connect Some(\"127.0.0.1\"):Some({port})"),
            "asked GET /api/no per_request=true".to_string(),
            "denied 403 GET /api/no: denied by approval apr_no".to_string(),
            "asked GET /api/ok per_request=true".to_string(),
            "credential TOKEN GET /api/ok api-token".to_string(),
            format!("origin GET /api/ok?q=1 auth=Bearer {SECRET}"),
            "credential_result 7 200".to_string(),
            "asked GET /api/late per_request=true".to_string(),
            "denied 403 GET /api/late: approval apr_late not decided within 3 s (rule \"ask-api\")"
                .to_string(),
        ],
    );
    // The destination heard nothing, not even a TCP handshake, before the
    // first request a person approved: one connection, opened right after
    // that approval (log position 4, after "asked GET /api/ok").
    assert_eq!(s2.log.accepts(), [4], "{log:?}");
}
