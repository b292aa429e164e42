//! One session held by one process at a time across every control process
//! on the shared database: a session-level advisory lock, on a connection
//! of its own pool kept for as long as the hold lives.
//!
//! Why an advisory lock and not a row: it goes with its connection. A
//! process that dies (SIGKILL, power) closes its connections and the
//! server releases its holds at once; no lease to expire, no holder id to
//! fence.
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

use super::{SessionHold, StoreError, StoreResult};
use deadpool_postgres::{Client, Object, Pool};

/// The advisory lock class (the first key of the two-key form), "rnds";
/// the session id's `hashtext` is the second. A hash collision only makes
/// two sessions wait for each other.
const CLASS: i32 = 0x726e_6473;

struct PgHold {
    client: Option<Client>,
    session_id: String,
}

impl Drop for PgHold {
    fn drop(&mut self) {
        let Some(c) = self.client.take() else { return };
        let id = std::mem::take(&mut self.session_id);
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            // No runtime to say it on: closing the connection releases it.
            drop(Object::take(c));
            return;
        };
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
        });
    }
}

/// Takes the hold on `session_id` (see `RoundStore::lock_session`).
pub(super) async fn lock_session(
    pool: &Pool,
    session_id: &str,
    wait: bool,
) -> StoreResult<Option<SessionHold>> {
    let (pool, id) = (pool.clone(), session_id.to_string());
    tokio::spawn(take(pool, id, wait))
        .await
        .map_err(|e| StoreError::Backend(format!("session lock task: {e}")))?
}

async fn take(pool: Pool, session_id: String, wait: bool) -> StoreResult<Option<SessionHold>> {
    let c = pool
        .get()
        .await
        .map_err(|e| StoreError::Unavailable(format!("connect: {e}")))?;
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
    let got = match got {
        Ok(got) => got,
        Err(e) => {
            // Whether the server took it before the error (or an answer
            // that cannot be read) is unknown: the connection goes, and
            // with it anything it held; it never returns to the pool.
            drop(Object::take(c));
            return Err(super::pg::pg("take session lock")(e));
        }
    };
    if !got {
        return Ok(None);
    }
    Ok(Some(SessionHold::new(PgHold {
        client: Some(c),
        session_id,
    })))
}
