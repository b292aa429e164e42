//! Playback for reviewers: the room's log as a timeline, and the files as
//! they stood at any entry of it, rebuilt from the stored updates alone
//! (from the nearest stored checkpoint of them, `checkpoint.rs`).

use super::{checkpoint, doc};
use crate::ids::{now_ms, rfc3339};
use crate::limits::{MAX_DOC_CHECKPOINTS, MAX_DOC_CHECKPOINT_BYTES};
use crate::models::{DocumentAt, Timeline, TimelineEntry};
use crate::store::DocCheckpointRecord;
use crate::{Rounds, RoundsError};

impl Rounds {
    pub async fn timeline(
        &self,
        round_id: &str,
        session_id: &str,
    ) -> Result<Timeline, RoundsError> {
        let (_, s) = self.session(round_id, session_id).await?;
        let log = self.store.doc_log(&s.id, None).await?;
        Ok(Timeline {
            entries: log
                .into_iter()
                .map(|e| TimelineEntry {
                    idx: e.idx,
                    kind: e.kind,
                    author: e.author,
                    ref_id: e.ref_id,
                    at: rfc3339(e.created_at_ms),
                    at_ms: e.created_at_ms,
                    bytes: e.body.len() as u64,
                })
                .collect(),
        })
    }

    /// The files right after entry `idx` (404 past the log's end): the
    /// nearest checkpoint at or before it plus the entries after that
    /// (`checkpoint.rs`), byte for byte what replaying the whole log
    /// gives. Checkpoints the replay passed are stored for the next call.
    pub async fn document_at(
        &self,
        round_id: &str,
        session_id: &str,
        idx: u64,
    ) -> Result<DocumentAt, RoundsError> {
        let (_, s) = self.session(round_id, session_id).await?;
        let cp = self.store.doc_checkpoint(&s.id, idx).await?;
        let tail = self
            .store
            .doc_log_tail(&s.id, cp.as_ref().map(|c| c.idx), idx)
            .await?;
        // A checkpoint exists only beside its log entry (a foreign key).
        let last = tail.last().map(|e| e.idx).or(cp.as_ref().map(|c| c.idx));
        if last != Some(idx) {
            return Err(RoundsError::NotFound(format!("log entry {idx}")));
        }
        let start = cp.as_ref().map(|c| checkpoint::Start {
            state: &c.state,
            log_bytes: c.log_bytes,
        });
        let r = checkpoint::rebuild(start, tail.iter().map(|e| (e.idx, e.body.as_slice())))
            .map_err(|e| RoundsError::Internal(format!("session {}'s document log: {e}", s.id)))?;
        let files = doc::files(&r.doc);
        self.keep_checkpoints(&s.id, r.taken).await;
        Ok(DocumentAt { idx, files })
    }

    /// Stores checkpoints a replay passed. A cache: a failure is logged
    /// and playback goes on from the log.
    pub(super) async fn keep_checkpoints(&self, session_id: &str, taken: Vec<checkpoint::Taken>) {
        if taken.is_empty() {
            return;
        }
        let now = now_ms();
        let cps: Vec<DocCheckpointRecord> = taken
            .into_iter()
            .map(|t| DocCheckpointRecord {
                session_id: session_id.to_string(),
                idx: t.idx,
                state: t.state,
                log_bytes: t.log_bytes,
                created_at_ms: now,
            })
            .collect();
        let put = self
            .store
            .put_doc_checkpoints(&cps, MAX_DOC_CHECKPOINTS, MAX_DOC_CHECKPOINT_BYTES)
            .await;
        if let Err(e) = put {
            tracing::warn!(session = %session_id, error = %e, "rounds: playback checkpoints not stored");
        }
    }
}
