//! Racing writers, for the stores' conformance suites: each contract that
//! holds "exactly one wins" is checked by starting its contenders at once.

use std::future::Future;

/// Runs `f(0)`, ..., `f(n - 1)` as tasks at once; their results in order.
/// A task that panics fails the caller.
pub async fn race<T, F>(n: usize, f: impl FnMut(usize) -> F) -> Vec<T>
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    let tasks: Vec<_> = (0..n).map(f).map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await.expect("a racing task panicked"));
    }
    out
}

/// A suffix unique per call: the process id and the clock, so two runs
/// (or two suites in one run) on one database never share an id.
pub fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("t{}x{nanos:x}", std::process::id())
}
