//! The state that authorises an egress connection, checked in the commit
//! of its intent: the session is unfinished and still pinned to the policy
//! version that allowed the destination. A policy move or the session's end
//! racing the proxy's decision makes the intent's commit roll back, and the
//! proxy refuses the connection instead of dialling on a stale verdict.

use crate::state::SessionState;
use hatchery_db::{args, DbError, Joined, Tx};

/// A [`Joined`] that declines unless the session row (locked by the
/// append) still authorises the connection.
pub(crate) struct Authorised<'a> {
    pub session: &'a str,
    /// The version that decided; `None` checks only that the session is
    /// unfinished.
    pub policy_version: Option<u32>,
}

#[async_trait::async_trait]
impl Joined for Authorised<'_> {
    async fn write(&mut self, tx: &mut Tx, _: &[u64]) -> Result<bool, DbError> {
        let sql = "SELECT state, spec FROM sessions WHERE id = $1";
        let Some(row) = tx.query_opt(sql, args![self.session]).await? else {
            return Ok(false);
        };
        let (state, spec): (String, String) = (row.get("state")?, row.get("spec")?);
        if !matches!(SessionState::parse(&state), Some(s) if !s.is_terminal()) {
            return Ok(false);
        }
        let Some(want) = self.policy_version else {
            return Ok(true);
        };
        // Only `policy_version` of the spec is read; an unreadable spec
        // authorises nothing.
        let pinned = serde_json::from_str::<serde_json::Value>(&spec)
            .ok()
            .and_then(|v| v.get("policy_version").and_then(|n| n.as_u64()));
        Ok(pinned == Some(u64::from(want)))
    }
}
