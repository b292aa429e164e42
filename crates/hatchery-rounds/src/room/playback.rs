//! Playback for reviewers: the room's log as a timeline, and the files as
//! they stood at any entry of it, rebuilt from the stored updates alone.

use super::doc;
use crate::ids::rfc3339;
use crate::models::{DocumentAt, Timeline, TimelineEntry};
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

    /// The files right after entry `idx` (404 past the log's end).
    pub async fn document_at(
        &self,
        round_id: &str,
        session_id: &str,
        idx: u64,
    ) -> Result<DocumentAt, RoundsError> {
        let (_, s) = self.session(round_id, session_id).await?;
        let log = self.store.doc_log(&s.id, Some(idx)).await?;
        if log.last().map(|e| e.idx) != Some(idx) {
            return Err(RoundsError::NotFound(format!("log entry {idx}")));
        }
        let d = doc::replay(
            log.iter()
                .map(|e| e.body.as_slice())
                .filter(|b| !b.is_empty()),
        )
        .map_err(|e| RoundsError::Internal(format!("session {}'s document log: {e}", s.id)))?;
        Ok(DocumentAt {
            idx,
            files: doc::files(&d),
        })
    }
}
