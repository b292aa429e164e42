//! Egress proxy figures for `make bench`, all on loopback: connect overhead
//! (TCP connect + CONNECT + a 1-byte echo round trip, against the same echo
//! with a direct connection in the same run) and tunnel throughput (bytes
//! from a source server through one tunnel, against a direct connection).
//! `cargo run --release -p hatchery-egress --example egress_bench -- [N] [MiB]`

use hatchery_egress::{Identify, Limits, PolicySource, Proxy};
use hatchery_policy::{Policy, PolicyDocument};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

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
    async fn policy_for(
        &self,
        _: &str,
    ) -> Result<hatchery_egress::SessionPolicy, hatchery_egress::SourceError> {
        Ok(self.0.clone().into())
    }
}

async fn echo_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = l.accept().await.unwrap();
            let _ = s.set_nodelay(true);
            tokio::spawn(async move {
                let mut b = [0u8; 1];
                while let Ok(1) = s.read(&mut b).await {
                    if s.write_all(&b).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    a
}

async fn source_server(bytes: usize) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = l.accept().await.unwrap();
            tokio::spawn(async move {
                // Wait for one byte (sent after the tunnel is up), then stream.
                let mut b = [0u8; 1];
                if s.read_exact(&mut b).await.is_err() {
                    return;
                }
                let chunk = vec![7u8; 256 * 1024];
                let mut left = bytes;
                while left > 0 {
                    let n = left.min(chunk.len());
                    if s.write_all(&chunk[..n]).await.is_err() {
                        return;
                    }
                    left -= n;
                }
            });
        }
    });
    a
}

async fn tunnel(proxy: SocketAddr, to: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(format!("CONNECT {to} HTTP/1.1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut b = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut b).await.unwrap();
        got.push(b[0]);
    }
    assert!(
        got.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    s
}

fn pct(mut v: Vec<f64>, q: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 * q) as usize).min(v.len() - 1)]
}

#[tokio::main]
async fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200);
    let mib: usize = std::env::args()
        .nth(2)
        .and_then(|a| a.parse().ok())
        .unwrap_or(512);
    let echo = echo_server().await;
    let source = source_server(mib << 20).await;
    let doc: PolicyDocument = serde_json::from_value(serde_json::json!({"name": "bench", "rules": [
        {"id": "bench-loopback", "effect": "allow", "match": {"tools": ["egress"], "hosts": ["127.0.0.1/32"], "ports": [echo.port(), source.port()]}}
    ]}))
    .unwrap();
    let proxy = Proxy::new(
        Arc::new(One),
        Arc::new(Fixed(Arc::new(Policy::compile(&doc).unwrap()))),
        Arc::new(|_| {}),
        Limits::default(),
    );
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let paddr = l.local_addr().unwrap();
    tokio::spawn(proxy.serve(l));

    let (mut direct, mut proxied) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let t = Instant::now();
        let mut s = TcpStream::connect(echo).await.unwrap();
        s.set_nodelay(true).unwrap();
        s.write_all(b"x").await.unwrap();
        let mut b = [0u8; 1];
        s.read_exact(&mut b).await.unwrap();
        direct.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        let mut s = tunnel(paddr, echo).await;
        s.write_all(b"x").await.unwrap();
        s.read_exact(&mut b).await.unwrap();
        proxied.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let rate = |mut s: TcpStream| async move {
        let t = Instant::now();
        s.write_all(b"g").await.unwrap();
        let mut buf = vec![0u8; 256 * 1024];
        let mut total = 0usize;
        loop {
            let k = s.read(&mut buf).await.unwrap();
            if k == 0 {
                break;
            }
            total += k;
        }
        assert_eq!(total, mib << 20);
        total as f64 / (1 << 20) as f64 / t.elapsed().as_secs_f64()
    };
    let direct_rate = rate(TcpStream::connect(source).await.unwrap()).await;
    let tunnel_rate = rate(tunnel(paddr, source).await).await;
    let (d50, d99, p50, p99) = (
        pct(direct.clone(), 0.5),
        pct(direct, 0.99),
        pct(proxied.clone(), 0.5),
        pct(proxied, 0.99),
    );
    println!("egress proxy (hatchery-egress example egress_bench), loopback:");
    println!("  direct connect + 1-byte echo       n={n} p50={d50:.3} ms p99={d99:.3} ms");
    println!("  through CONNECT + 1-byte echo      n={n} p50={p50:.3} ms p99={p99:.3} ms  (+{:.3} ms p50; goal <= 1 ms)", p50 - d50);
    println!("  throughput {mib} MiB: direct {direct_rate:.0} MiB/s, through a tunnel {tunnel_rate:.0} MiB/s ({:.0} %; goal >= 200 MB/s)", tunnel_rate / direct_rate * 100.0);
}
