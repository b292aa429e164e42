use super::*;
use crate::events::GatewayEvent;
use axum::body::Body;
use tower::ServiceExt;

/// Drops every event.
struct NoEvents;
impl GatewayEvents for NoEvents {
    fn record(&self, _: GatewayEvent) {}
}

fn settings(dir: &Path) -> Settings {
    Settings {
        openai_upstream: Some("http://127.0.0.1:9".into()),
        anthropic_upstream: None,
        upstream_ca_file: None,
        upstream_key_file: None,
        prices: Some(dir.join("prices.json")),
        guest_port: 9100,
        max_output_tokens: 64,
        reservation_ttl: Duration::from_secs(300),
        upstream_timeout: Duration::from_secs(5),
    }
}

async fn store() -> (Arc<dyn BudgetStore>, Arc<dyn KeyStore>) {
    let s = Arc::new(crate::store::GatewayStore::open_in_memory().await.unwrap());
    (s.clone(), s)
}

async fn built(s: &Settings) -> Result<Arc<Gateway>, EmbedError> {
    let (store, keys) = store().await;
    let r = prometheus::Registry::new();
    build(s, store, keys, Arc::new(NoEvents), &r, None)
}

/// An upstream needs its price table, readable and well-formed; the key
/// file is read and trimmed.
#[tokio::test]
async fn what_a_gateway_is_built_from() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = settings(dir.path());
    assert!(matches!(
        built(&s).await.err().unwrap(),
        EmbedError::File { .. }
    ));
    std::fs::write(dir.path().join("prices.json"), "{not json").unwrap();
    let e = built(&s).await.err().unwrap();
    assert!(matches!(e, EmbedError::Prices { .. }), "{e}");
    assert!(e.to_string().starts_with("price table "), "{e}");
    std::fs::write(
        dir.path().join("prices.json"),
        r#"{"models": {"m": {"input_cents_per_mtok": 1, "output_cents_per_mtok": 2}}}"#,
    )
    .unwrap();
    s.upstream_key_file = Some(dir.path().join("key"));
    std::fs::write(dir.path().join("key"), "sk-1\n").unwrap();
    let g = built(&s).await.unwrap();
    assert!(g.openai.is_some() && g.anthropic.is_none());
    assert_eq!(g.reservation_ttl_ms, 300_000);
    assert!(g.trust_sandbox_header && g.admin_key.is_empty());
    s.prices = None;
    assert!(matches!(
        built(&s).await.err().unwrap(),
        EmbedError::NoPrices
    ));
    s.openai_upstream = Some("ftp://x".into());
    s.prices = Some(dir.path().join("prices.json"));
    assert!(matches!(
        built(&s).await.err().unwrap(),
        EmbedError::Upstream(_)
    ));
}

/// Guest code reaches the model routes; the admin routes are not there.
#[tokio::test]
async fn only_the_model_routes_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let s = settings(dir.path());
    std::fs::write(dir.path().join("prices.json"), "{}").unwrap();
    let app = model_routes(built(&s).await.unwrap());
    let get = |uri: &str, method: &str| {
        axum::http::Request::builder()
            .method(method)
            .uri(uri)
            .header("content-type", "application/json")
            .body(Body::from("{}"))
            .unwrap()
    };
    for (uri, method) in [
        ("/admin/keys", "POST"),
        ("/admin/budgets/session:x", "GET"),
        ("/metrics", "GET"),
    ] {
        let r = app.clone().oneshot(get(uri, method)).await.unwrap();
        assert_eq!(r.status(), 404, "{uri}");
    }
    // No sandbox header: the call is nobody's, refused before upstream.
    let r = app
        .oneshot(get("/v1/chat/completions", "POST"))
        .await
        .unwrap();
    assert!(r.status().is_client_error(), "{}", r.status());
}

/// Without an upstream nothing starts (no events writer either); with
/// one, the socket is served in the data dir.
#[tokio::test]
async fn a_host_serves_its_sandboxes_on_a_socket() {
    let dir = tempfile::tempdir().unwrap();
    let db = hatchery_db::Db::sqlite_memory().unwrap();
    let r = prometheus::Registry::new();
    let mut s = settings(dir.path());
    s.openai_upstream = None;
    let none = serve_sandboxes(&s, &db, dir.path(), &r, || unreachable!(), None).await;
    assert!(none.unwrap().is_none());
    let keys = HostKeys {
        api_key: "k".into(),
        daemon_key: "dk".into(),
    };
    let none = serve_hosts(&s, &db, dir.path(), &r, keys, |_| unreachable!(), None).await;
    assert!(none.unwrap().is_none());

    let s = settings(dir.path());
    std::fs::write(dir.path().join("prices.json"), "{}").unwrap();
    let link = serve_sandboxes(&s, &db, dir.path(), &r, || Arc::new(NoEvents), None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(link.socket, dir.path().join("gateway.sock"));
    assert_eq!(link.guest_port, 9100);
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut c = tokio::net::UnixStream::connect(&link.socket).await.unwrap();
    c.write_all(
        b"POST /admin/keys HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let mut got = String::new();
    c.read_to_string(&mut got).await.unwrap();
    assert!(got.starts_with("HTTP/1.1 404"), "{got}");
}

/// A relaying host writes its bindings where the control role reads
/// them: a per-host database will not do.
#[tokio::test]
async fn a_relaying_host_needs_the_shared_database() {
    let dir = tempfile::tempdir().unwrap();
    let db = hatchery_db::Db::sqlite_memory().unwrap();
    let me = HostIdentity {
        api_key: "k",
        daemon_key: "dk",
        host_id: "h1",
    };
    let e = relay_sandboxes(&settings(dir.path()), &db, dir.path(), "http://c:1/", me)
        .await
        .err()
        .unwrap();
    assert!(matches!(e, EmbedError::RelayNeedsSharedDb), "{e}");
}
