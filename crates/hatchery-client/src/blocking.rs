//! A blocking facade for synchronous callers (the CLI): the async client on
//! a private current-thread runtime. Not for use inside an async task (it
//! would block that task's thread); call it from a plain thread or from
//! `spawn_blocking`.

use crate::error::{ClientError, Result};
use crate::streams::{
    BuildStream, CodeEvent, CodeStream, ExecEvent, ExecStream, ProcessEvent, ProcessStream,
};
use crate::transport::EventStream;
use crate::Client;
use std::future::Future;

pub struct BlockingClient {
    rt: tokio::runtime::Runtime,
    client: Client,
}

impl BlockingClient {
    pub fn new(client: Client) -> Result<Self> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| ClientError::InvalidRequest(format!("cannot start a runtime: {e}")))?;
        Ok(BlockingClient { rt, client })
    }

    /// The async client, to build a call for `run`.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Runs one call to its end: `b.run(b.client().sandbox(id))`.
    pub fn run<F: Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// Iterates a stream's events on this runtime.
    pub fn iter<S: NextEvent>(&self, stream: S) -> Iter<'_, S> {
        Iter {
            rt: &self.rt,
            stream,
        }
    }
}

/// The streams `BlockingClient::iter` can walk.
pub trait NextEvent {
    type Item;
    fn next_event(&mut self) -> impl Future<Output = Result<Option<Self::Item>>>;
}

impl NextEvent for ExecStream {
    type Item = ExecEvent;
    fn next_event(&mut self) -> impl Future<Output = Result<Option<ExecEvent>>> {
        self.next()
    }
}

impl NextEvent for CodeStream {
    type Item = CodeEvent;
    fn next_event(&mut self) -> impl Future<Output = Result<Option<CodeEvent>>> {
        self.next()
    }
}

impl NextEvent for ProcessStream {
    type Item = ProcessEvent;
    fn next_event(&mut self) -> impl Future<Output = Result<Option<ProcessEvent>>> {
        self.next()
    }
}

impl NextEvent for BuildStream {
    type Item = crate::models::BuildEvent;
    fn next_event(&mut self) -> impl Future<Output = Result<Option<Self::Item>>> {
        self.next()
    }
}

impl NextEvent for EventStream {
    type Item = crate::sse::SseEvent;
    fn next_event(&mut self) -> impl Future<Output = Result<Option<Self::Item>>> {
        self.next()
    }
}

pub struct Iter<'a, S> {
    rt: &'a tokio::runtime::Runtime,
    stream: S,
}

impl<S: NextEvent> Iterator for Iter<'_, S> {
    type Item = Result<S::Item>;

    fn next(&mut self) -> Option<Self::Item> {
        self.rt.block_on(self.stream.next_event()).transpose()
    }
}

impl<S> Iter<'_, S> {
    /// The stream back (to drop it, which closes its connection).
    pub fn into_inner(self) -> S {
        self.stream
    }
}
