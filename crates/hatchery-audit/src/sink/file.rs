//! The append-only file: one JSON line per head, fsynced before `put`
//! returns.

use super::{AnchorSink, Batch, SinkError};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

#[derive(Debug, Clone)]
pub struct FileSink {
    pub path: PathBuf,
}

impl AnchorSink for FileSink {
    fn kind(&self) -> &'static str {
        "file"
    }

    /// Appends the lines and fsyncs the file (and, when it was just
    /// created, its directory).
    fn put(&self, batch: &Batch) -> Result<(), SinkError> {
        let err = |source| SinkError::File {
            path: self.path.clone(),
            source,
        };
        let created = !self.path.exists();
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(&self.path)
            .map_err(err)?;
        // One write of whole lines: O_APPEND keeps concurrent writers'
        // lines from interleaving within a line.
        f.write_all(batch.jsonl.as_bytes()).map_err(err)?;
        f.sync_all().map_err(err)?;
        if created {
            if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::File::open(dir)
                    .and_then(|d| d.sync_all())
                    .map_err(err)?;
            }
        }
        Ok(())
    }
}
