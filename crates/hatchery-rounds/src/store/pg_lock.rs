//! The one PostgreSQL-only piece of the rounds store: one session held
//! by one process at a time across every control process on the shared
//! database, as a session-level advisory lock on a connection kept for as
//! long as the hold lives (a Run, a Submit's capture: up to the round's
//! wall limit).
//!
//! Why not `Tx::lock` (a transaction-scoped lock): the hold spans sandbox
//! calls, not statements. As a transaction it would keep one open, idle,
//! for a whole Run (on SQLite holding the only write lock, every
//! product's writes waiting behind it), and `Tx::lock` only waits, where
//! a Run must be refused at once while another holds the session.
//!
//! Why an advisory lock and not a row: it goes with its connection. A
//! process that dies (SIGKILL, power) closes its connections and the
//! server releases its holds at once; no lease to expire, no holder id to
//! fence. On SQLite one process owns the file, so there is nothing to
//! hold across processes ([`super::DbStore`] grants at once).
//!
//! The connections come from the daemon's one pool, at most half of it
//! at once: holds last as long as a Run, and a Run needs a connection of
//! its own for its queries (it records the run), so holds must never take
//! them all. A hold beyond that waits for one, as long as the pool makes
//! a query wait, then answers unavailable (retry).
//!
//! The one way such a lock outlives its holder is a pooled connection
//! that goes back to the pool still holding it. Two rules keep that from
//! happening:
//! - a hold is released on its own connection, and a connection that
//!   cannot confirm the release is closed (taken out of the pool), which
//!   releases it server-side;
//! - taking a hold runs in a task of its own, so a request dropped while
//!   it waits (the browser went away) cannot leave a lock taken with no
//!   hold to release it: the task finishes, and its hold is dropped.
//!
//! A release is said by a task of its own, after the hold is dropped, so
//! this process's next request for the session (a candidate's next Run,
//! sent the moment the last one answered) could reach the server first
//! and find the session still held, by itself. A hold taken here
//! therefore first waits for this process's release of the same session
//! still on its way (`releasing`).

use super::{SessionHold, StoreResult};
use deadpool_postgres::{Object, Pool, PoolError, TimeoutType};
use hatchery_db::DbError;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

/// Releases under way, by session: each entry's sender goes when its
/// release has been said (or given up), which is what a taker waits for.
type Releasing = Arc<Mutex<HashMap<String, (u64, watch::Receiver<()>)>>>;

/// The advisory lock class (the first key of the two-key form), "rnds";
/// the session id's `hashtext` is the second. A hash collision only makes
/// two sessions wait for each other.
const CLASS: i32 = 0x726e_6473;

/// The session holds of one store: the shared pool, and how much of it
/// holds may take.
#[derive(Clone)]
pub(super) struct Holds {
    pool: Pool,
    slots: Arc<Semaphore>,
    releasing: Releasing,
}

struct PgHold {
    client: Option<Object>,
    session_id: String,
    slot: Option<OwnedSemaphorePermit>,
    releasing: Releasing,
}

impl Drop for PgHold {
    fn drop(&mut self) {
        let Some(c) = self.client.take() else { return };
        let id = std::mem::take(&mut self.session_id);
        let slot = self.slot.take();
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            // No runtime to say it on: closing the connection releases it.
            drop(Object::take(c));
            return;
        };
        static RELEASES: AtomicU64 = AtomicU64::new(0);
        let n = RELEASES.fetch_add(1, Ordering::Relaxed);
        let (said, pending) = watch::channel(());
        let releasing = self.releasing.clone();
        releasing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.clone(), (n, pending));
        rt.spawn(async move {
            let released = c
                .query_one(
                    "SELECT pg_advisory_unlock($1, hashtext($2)) AS released",
                    &[&CLASS, &id],
                )
                .await
                .and_then(|r| r.try_get::<_, bool>("released"));
            match released {
                // Back to the pool, holding nothing.
                Ok(true) => drop(c),
                other => {
                    tracing::warn!(session = %id, result = ?other.map_err(|e| e.to_string()),
                        "rounds: a session lock's release was not confirmed; closing its connection");
                    drop(Object::take(c));
                }
            }
            drop(slot);
            let mut m = releasing.lock().unwrap_or_else(|p| p.into_inner());
            if m.get(&id).is_some_and(|(k, _)| *k == n) {
                m.remove(&id);
            }
            drop(said);
        });
    }
}

impl Holds {
    pub(super) fn new(pool: &Pool) -> Holds {
        let size = pool.status().max_size;
        Holds {
            pool: pool.clone(),
            slots: Arc::new(Semaphore::new((size / 2).max(1))),
            releasing: Arc::default(),
        }
    }

    /// Takes the hold on `session_id` (see `RoundStore::lock_session`).
    pub(super) async fn lock_session(
        &self,
        session_id: &str,
        wait: bool,
    ) -> StoreResult<Option<SessionHold>> {
        let (me, id) = (self.clone(), session_id.to_string());
        let taken = tokio::spawn(async move { me.take(id, wait).await });
        taken.await.map_err(DbError::Task)?
    }

    async fn take(self, session_id: String, wait: bool) -> StoreResult<Option<SessionHold>> {
        let pending = self
            .releasing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&session_id)
            .map(|(_, r)| r.clone());
        if let Some(mut said) = pending {
            // Resolves when the sender goes: the release was said.
            let _ = tokio::time::timeout(hatchery_db::POOL_TIMEOUT, said.changed()).await;
        }
        let slot = tokio::time::timeout(
            hatchery_db::POOL_TIMEOUT,
            self.slots.clone().acquire_owned(),
        )
        .await
        .map_err(|_| DbError::Pool(PoolError::Timeout(TimeoutType::Wait)))?
        .expect("the semaphore is never closed");
        let c = self.pool.get().await.map_err(DbError::from)?;
        // `pg_advisory_lock` waits in the server, on this connection only.
        let sql = if wait {
            "SELECT true AS got FROM (SELECT pg_advisory_lock($1, hashtext($2))) AS l"
        } else {
            "SELECT pg_try_advisory_lock($1, hashtext($2)) AS got"
        };
        let got = c
            .query_one(sql, &[&CLASS, &session_id])
            .await
            .and_then(|r| r.try_get::<_, bool>("got"));
        match got {
            Ok(false) => Ok(None),
            Ok(true) => Ok(Some(SessionHold::new(PgHold {
                client: Some(c),
                session_id,
                slot: Some(slot),
                releasing: self.releasing.clone(),
            }))),
            Err(e) => {
                // Whether the server took it before the error (or an
                // answer that cannot be read) is unknown: the connection
                // goes, and with it anything it held; it never returns to
                // the pool.
                drop(Object::take(c));
                Err(DbError::from(e).into())
            }
        }
    }
}
