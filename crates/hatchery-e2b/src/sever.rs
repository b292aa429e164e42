//! Ending a streamed response by dropping its connection, as E2B's edge
//! does when the sandbox behind a stream dies: the SDKs tell a killed
//! sandbox from an error answer by exactly that (a connection dropped
//! mid-response, then `/health` failing), and say "sandbox was killed".
//! An error message in the stream would be reported as a plain failure,
//! or, by the code interpreter's SDK, as a normal end of the run.

use crate::backend::{Backend, FailKind};
use axum::body::{Body, Bytes};
use futures::{Stream, StreamExt};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// What the body ends with when it is severed; hyper then closes the
/// connection without the last chunk, which the client sees as a broken
/// response.
#[derive(Debug, thiserror::Error)]
#[error("the sandbox ended while the response was being streamed")]
pub struct SandboxGone;

/// Set by the task feeding a stream, before it lets go of the stream, to
/// end the response by dropping the connection.
#[derive(Clone, Default)]
pub struct Sever(Arc<AtomicBool>);

impl Sever {
    pub fn cut(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    fn is_cut(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// A response body of `s`'s chunks; if `sever` was cut by the time `s`
/// ends, it ends in an error instead of cleanly.
pub fn body<S>(s: S, sever: Sever) -> Body
where
    S: Stream<Item = Bytes> + Send + 'static,
{
    let tail = futures::stream::once(async move { sever.is_cut() })
        .filter_map(|cut| async move { cut.then_some(Err(SandboxGone)) });
    Body::from_stream(s.map(Ok::<_, SandboxGone>).chain(tail))
}

/// Whether sandbox `id` no longer runs (killed, expired, paused): asked
/// after a stream's source failed, to tell a dead sandbox from an error.
pub async fn sandbox_gone(backend: &dyn Backend, id: &str) -> bool {
    matches!(
        backend.get(id).await,
        Err(e) if matches!(e.kind, FailKind::SandboxNotFound | FailKind::NotRunning)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn collect(b: Body) -> (Vec<u8>, bool) {
        let mut s = b.into_data_stream();
        let mut got = vec![];
        while let Some(c) = s.next().await {
            match c {
                Ok(c) => got.extend_from_slice(&c),
                Err(_) => return (got, true),
            }
        }
        (got, false)
    }

    #[tokio::test]
    async fn a_cut_stream_ends_in_an_error_after_its_chunks() {
        let sever = Sever::default();
        sever.cut();
        let s = futures::stream::iter([Bytes::from_static(b"a"), Bytes::from_static(b"b")]);
        assert_eq!(collect(body(s, sever)).await, (b"ab".to_vec(), true));
    }

    #[tokio::test]
    async fn an_uncut_stream_ends_cleanly() {
        let s = futures::stream::iter([Bytes::from_static(b"a")]);
        assert_eq!(
            collect(body(s, Sever::default())).await,
            (b"a".to_vec(), false)
        );
    }

    #[tokio::test]
    async fn the_cut_is_read_when_the_stream_ends_not_when_it_starts() {
        let sever = Sever::default();
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(1);
        let b = body(
            tokio_stream::wrappers::ReceiverStream::new(rx),
            sever.clone(),
        );
        let feeder = tokio::spawn(async move {
            tx.send(Bytes::from_static(b"x")).await.unwrap();
            sever.cut();
        });
        let got = collect(b).await;
        feeder.await.unwrap();
        assert_eq!(got, (b"x".to_vec(), true));
    }
}
