//! One transaction across two products (issue 32): a store that opens a
//! transaction for its own writes runs another product's [`Joined`] writes
//! in it before it commits, so both commit or neither does. The session log
//! and the broker's call record are the first pair: a call's events and the
//! row that says they were written are one commit, so no crash leaves one
//! without the other.

use crate::{DbError, Tx};

/// Writes of another product that must commit with the opening store's.
#[async_trait::async_trait]
pub trait Joined: Send {
    /// Runs inside `tx`, after the opening store's own writes; `seqs` are
    /// what those numbered (a session's event seqs, in order). `false`
    /// rolls the whole transaction back: the joined write lost a race (the
    /// row it guards moved on), so nothing of either product may stand.
    async fn write(&mut self, tx: &mut Tx, seqs: &[u64]) -> Result<bool, DbError>;
}

/// Nothing joined: the opening store's writes alone.
pub struct Alone;

#[async_trait::async_trait]
impl Joined for Alone {
    async fn write(&mut self, _: &mut Tx, _: &[u64]) -> Result<bool, DbError> {
        Ok(true)
    }
}
