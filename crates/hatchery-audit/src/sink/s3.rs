//! The object-store sink: each batch a new object (never an overwrite),
//! put before `put` returns.

use super::{AnchorSink, Batch, SinkError};
use crate::s3::location::new_node;
use crate::s3::S3Store;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[derive(Debug)]
pub struct S3Sink {
    store: Arc<S3Store>,
    /// The runtime the requests run on (`put` is called on a blocking
    /// thread, which may wait on it).
    rt: tokio::runtime::Handle,
    /// This process's part of every key.
    node: String,
    next: AtomicU64,
}

impl S3Sink {
    pub fn new(store: Arc<S3Store>, rt: tokio::runtime::Handle) -> S3Sink {
        S3Sink {
            store,
            rt,
            node: new_node(),
            next: AtomicU64::new(0),
        }
    }

    /// The key the next batch goes to.
    fn next_key(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::SeqCst);
        self.store
            .location
            .object_key(time::OffsetDateTime::now_utc(), &self.node, n)
    }
}

impl AnchorSink for S3Sink {
    fn kind(&self) -> &'static str {
        "s3"
    }

    fn put(&self, batch: &Batch) -> Result<(), SinkError> {
        let key = self.next_key();
        let body = bytes::Bytes::from(batch.jsonl.clone());
        Ok(self.rt.block_on(self.store.put_new(&key, body))?)
    }
}
