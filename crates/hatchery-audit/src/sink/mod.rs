//! Where anchor lines go: an append-only file, a hook command, an
//! S3-compatible object store. Each sink gets every round's lines on its
//! own: one that fails does not hold the others back (the file keeps
//! anchoring while the object store is unreachable), and it is retried
//! with what it missed at the next round.

pub mod file;
pub mod hook;
pub mod s3;

pub use file::FileSink;
pub use hook::{HookError, HookSink};
pub use s3::S3Sink;

use crate::line::AnchorLine;

/// One round's lines, and the same as JSON lines (what a sink stores).
#[derive(Debug, Clone)]
pub struct Batch {
    pub lines: Vec<AnchorLine>,
    pub jsonl: String,
}

impl Batch {
    pub fn new(lines: Vec<AnchorLine>) -> Batch {
        let mut jsonl = String::new();
        for l in &lines {
            // An AnchorLine (strings and an integer) always serializes.
            jsonl.push_str(&serde_json::to_string(l).unwrap_or_default());
            jsonl.push('\n');
        }
        Batch { lines, jsonl }
    }
}

/// A place anchor lines are written to. `put` runs on a blocking thread
/// and returns once the lines are durable there.
pub trait AnchorSink: Send + Sync + std::fmt::Debug {
    /// The `sink` label of the metrics and the logs: `file`, `hook`, `s3`.
    fn kind(&self) -> &'static str;
    fn put(&self, batch: &Batch) -> Result<(), SinkError>;
}

#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error("anchor file {}", .path.display())]
    File {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("anchor hook")]
    Hook(#[from] HookError),
    #[error("anchor object store")]
    S3(#[from] crate::s3::S3Error),
}

/// A sink for tests: records what it is given, or refuses while told to.
#[cfg(test)]
#[derive(Debug, Default)]
pub struct FakeSink {
    pub got: std::sync::Mutex<Vec<Batch>>,
    pub refuse: std::sync::atomic::AtomicBool,
}

#[cfg(test)]
impl AnchorSink for FakeSink {
    fn kind(&self) -> &'static str {
        "fake"
    }
    fn put(&self, batch: &Batch) -> Result<(), SinkError> {
        if self.refuse.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(SinkError::File {
                path: "fake".into(),
                source: std::io::Error::other("refused"),
            });
        }
        self.got.lock().unwrap().push(batch.clone());
        Ok(())
    }
}
