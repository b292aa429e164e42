//! Waiting for a database at start: a daemon started beside its
//! PostgreSQL (systemd starts both) must not fail because the server is a
//! few seconds behind, and must not wait forever for one that is gone.

use std::time::{Duration, Instant};

/// How long a daemon waits for its database at start.
pub const STARTUP_WAIT: Duration = Duration::from_secs(60);

/// Runs `connect` again, with backoff (250 ms doubling to 5 s, each
/// attempt logged), while it fails because the database is not reachable
/// yet and [`STARTUP_WAIT`] has not passed; any other failure, or the last
/// one, is returned as is. One policy for every store a daemon opens.
pub async fn retry_while_unreachable<T, E, Fut>(
    what: &'static str,
    mut connect: impl FnMut() -> Fut,
    unreachable: impl Fn(&E) -> bool,
) -> Result<T, E>
where
    E: std::fmt::Display,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let started = Instant::now();
    let mut delay = Duration::from_millis(250);
    loop {
        match connect().await {
            Err(e) if unreachable(&e) && started.elapsed() < STARTUP_WAIT => {
                tracing::warn!(store = what, error = %e, retry_in_ms = delay.as_millis() as u64, "{what} store not reachable yet");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn unreachable_is_tried_again_and_anything_else_is_not() {
        let tries = AtomicU32::new(0);
        let r: Result<u32, String> = retry_while_unreachable(
            "test",
            || async {
                match tries.fetch_add(1, Ordering::SeqCst) {
                    0 | 1 => Err("down".to_string()),
                    n => Ok(n),
                }
            },
            |e| e == "down",
        )
        .await;
        assert_eq!(r, Ok(2));
        let tries = AtomicU32::new(0);
        let r: Result<u32, String> = retry_while_unreachable(
            "test",
            || async {
                tries.fetch_add(1, Ordering::SeqCst);
                Err("bad password".to_string())
            },
            |e| e == "down",
        )
        .await;
        assert_eq!(r, Err("bad password".to_string()));
        assert_eq!(tries.load(Ordering::SeqCst), 1);
    }
}
