//! The proxy's one way to open a TCP connection to a destination: within
//! the connect timeout, without Nagle, and, when it fails, the outcome
//! and status the guest and the session's log get. Used for a tunnel's
//! dial (proxy.rs) and for an intercepted destination dialled only after
//! its first approved request (intercept).

use crate::events::Outcome;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpStream;

/// Dials `addr`; on failure, the outcome, the status to answer and why.
pub(crate) async fn dial(
    addr: SocketAddr,
    timeout: Duration,
) -> Result<TcpStream, (Outcome, u16, String)> {
    let upstream = tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| (Outcome::Failed, 504, format!("connect to {addr} timed out")))?
        .map_err(|e| {
            let outcome = match e.kind() {
                std::io::ErrorKind::ConnectionRefused => Outcome::Refused,
                _ => Outcome::Failed,
            };
            (outcome, 502, format!("connect to {addr}: {e}"))
        })?;
    let _ = upstream.set_nodelay(true);
    Ok(upstream)
}
