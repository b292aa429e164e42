//! Group commit for the live rooms' keystroke updates (`round_doc_log`).
//!
//! Why: every room appends each update before fanning it out, and all of
//! a host's rooms share one database writer (SQLite's single write lock;
//! a relaxed transaction there is two trips to the blocking pool). At 50
//! rooms typing that is ~400 transactions a second through one queue, and
//! on a loaded machine each trip waits for a core, so the queue, not the
//! room, set the fan-out's tail (docs/benchmarks.md, live room). Here one
//! task takes every update waiting when the previous write ends and
//! writes them as one multi-row INSERT in one relaxed transaction: the
//! same two trips for a batch as for one update, so the writer keeps up
//! however many rooms type.
//!
//! Each caller still waits for its own row to commit (the room fans out
//! only what the log holds), and gets its own result: if a batch is
//! refused (one row's `(session_id, idx)` taken by another process), its
//! rows are written again one by one, so only that room sees the
//! conflict. A room has at most one update in flight (it appends under
//! its lock), so the queue holds at most one per open room.

use super::{DocLogRecord, StoreError, StoreResult};
use hatchery_db::{Db, Record, Value};
use tokio::sync::{mpsc, oneshot};

/// Rows in one INSERT at most: 7 parameters each, well under SQLite's 999.
const MAX_BATCH: usize = 64;

type Job = (DocLogRecord, oneshot::Sender<StoreResult<()>>);

/// The handle the store appends through (cheap to clone).
#[derive(Clone)]
pub(super) struct Appender {
    jobs: mpsc::UnboundedSender<Job>,
}

impl Appender {
    /// Starts the writing task on the current runtime; it ends when the
    /// last handle is dropped.
    pub(super) fn start(db: Db) -> Appender {
        let (jobs, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(db, rx));
        Appender { jobs }
    }

    /// Appends one update; returns once its row has committed (relaxed:
    /// `Db::begin_relaxed`).
    pub(super) async fn append(&self, e: DocLogRecord) -> StoreResult<()> {
        let (done, result) = oneshot::channel();
        self.jobs
            .send((e, done))
            .map_err(|_| StoreError::WriterGone)?;
        result.await.map_err(|_| StoreError::WriterGone)?
    }
}

async fn run(db: Db, mut rx: mpsc::UnboundedReceiver<Job>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let (rows, dones): (Vec<DocLogRecord>, Vec<_>) = batch.drain(..).unzip();
        match write(&db, &rows).await {
            Ok(()) => {
                for d in dones {
                    let _ = d.send(Ok(()));
                }
            }
            Err(e) if rows.len() == 1 => {
                if let Some(d) = dones.into_iter().next() {
                    let _ = d.send(Err(e));
                }
            }
            // Refused as a whole: each row on its own, so each caller gets
            // its own answer.
            Err(_) => {
                for (r, d) in rows.iter().zip(dones) {
                    let _ = d.send(write(&db, std::slice::from_ref(r)).await);
                }
            }
        }
    }
}

/// `rows` in one relaxed transaction, one INSERT.
async fn write(db: &Db, rows: &[DocLogRecord]) -> StoreResult<()> {
    let cols = DocLogRecord::COLUMNS;
    let mut args: Vec<Value> = Vec::with_capacity(rows.len() * cols.len());
    let mut tuples = Vec::with_capacity(rows.len());
    for r in rows {
        let first = args.len() + 1;
        args.extend(r.values()?);
        let marks: Vec<String> = (first..first + cols.len())
            .map(|i| format!("${i}"))
            .collect();
        tuples.push(format!("({})", marks.join(", ")));
    }
    let sql = format!(
        "INSERT INTO {} ({}) VALUES {}",
        DocLogRecord::TABLE,
        cols.join(", "),
        tuples.join(", ")
    );
    let mut tx = db.begin_relaxed().await?;
    tx.execute(&sql, &args).await?;
    tx.commit().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{DbStore, RoundStore};
    use super::*;
    use std::sync::Arc;

    fn row(sid: &str, idx: u64) -> DocLogRecord {
        DocLogRecord {
            session_id: sid.into(),
            idx,
            kind: "update".into(),
            author: "candidate".into(),
            ref_id: None,
            body: vec![idx as u8; 3],
            created_at_ms: idx,
        }
    }

    /// Many rooms appending at once (so writes are batched): every row
    /// once, in each room's order; a row refused within a batch fails only
    /// its own room.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_rooms_get_their_rows_and_only_their_conflict() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::sqlite(&dir.path().join("hatchery.db")).await.unwrap();
        let s: Arc<dyn RoundStore> = Arc::new(DbStore::open(db).await.unwrap());
        // A second process took room 7's entry 3.
        s.append_doc_log(&row("ses_7", 3)).await.unwrap();
        let mut rooms = Vec::new();
        for k in 0..40 {
            let s = s.clone();
            rooms.push(tokio::spawn(async move {
                let sid = format!("ses_{k}");
                for i in 0..30 {
                    if let Err(e) = s.append_doc_log(&row(&sid, i)).await {
                        assert!(e.conflict(), "{e}");
                        return (k, i);
                    }
                }
                (k, 30)
            }));
        }
        for r in rooms {
            let (k, done) = r.await.unwrap();
            let want = if k == 7 { 3 } else { 30 };
            assert_eq!(done, want, "room {k}");
            // Room 7: its own 0..3, then the other process's 3.
            let log = s.doc_log(&format!("ses_{k}"), None).await.unwrap();
            let idx: Vec<u64> = log.iter().map(|e| e.idx).collect();
            let len = if k == 7 { 4 } else { 30 };
            assert_eq!(idx, (0..len).collect::<Vec<u64>>(), "room {k}");
            assert!(log.iter().all(|e| e.body == vec![e.idx as u8; 3]));
        }
    }
}
