//! The broker's writes that commit with the session events they record,
//! in one transaction (hatchery_db::Joined, issue 32): a call's row never
//! says an event was written that is not in the log, and the log never
//! holds a call's event twice because a crash fell between two commits.
//! Each step names which of the events just appended (by index) it
//! stores the seq of; a step whose guard fails (the call moved on, the key
//! was taken, the seq was stored already) declines, and the events roll
//! back with it.

use super::db::{advance_tx, insert_tx, row_call, set_ref_tx};
use super::{Call, CallState, EventRef, Recorded, StoreError};
use hatchery_db::{DbError, Joined, Row, Tx};

/// The seq of the `i`th event appended, if there is one (the control
/// role's log may not know every seq of a post it repeated).
fn at(seqs: &[u64], i: Option<usize>) -> Option<u64> {
    i.and_then(|i| seqs.get(i).copied())
}

/// Which appended event (by index) is the call's `broker_call`, its
/// result, or the resolution of its review.
#[derive(Debug, Default, Clone, Copy)]
pub struct Refs {
    pub call: Option<usize>,
    pub result: Option<usize>,
    pub review: Option<usize>,
}

/// A new call's row, inserted with its events (a call decided at once:
/// denied, effect-free, or waiting for an approval). Declines when the
/// key is taken.
pub struct Insert {
    call: Call,
    refs: Refs,
    inserted: bool,
}

impl Insert {
    pub fn new(call: Call, refs: Refs) -> Insert {
        Insert {
            call,
            refs,
            inserted: false,
        }
    }

    /// The row as inserted, if it was (the transaction committed).
    pub fn inserted(self) -> Option<Call> {
        self.inserted.then_some(self.call)
    }
}

#[async_trait::async_trait]
impl Joined for Insert {
    async fn write(&mut self, tx: &mut Tx, seqs: &[u64]) -> Result<bool, DbError> {
        self.call.event_seq = at(seqs, self.refs.call);
        self.call.result_event_seq = at(seqs, self.refs.result);
        self.inserted = insert_tx(tx, &self.call).await? == 1;
        Ok(self.inserted)
    }
}

/// A call's move from one state to another with the events that record
/// it. Declines when the call is not in `from`.
pub struct Advance {
    session_id: String,
    seq: u64,
    from: CallState,
    to: CallState,
    rec: Recorded,
    refs: Refs,
    row: Option<Row>,
}

impl Advance {
    pub fn new(call: &Call, from: CallState, to: CallState, rec: Recorded, refs: Refs) -> Self {
        debug_assert!(from.valid_transition(to), "{from:?} -> {to:?}");
        Advance {
            session_id: call.session_id.clone(),
            seq: call.seq,
            from,
            to,
            rec,
            refs,
            row: None,
        }
    }

    /// The moved row, if the call moved (the transaction committed).
    pub fn moved(self) -> Result<Option<Call>, StoreError> {
        self.row.as_ref().map(row_call).transpose()
    }
}

#[async_trait::async_trait]
impl Joined for Advance {
    async fn write(&mut self, tx: &mut Tx, seqs: &[u64]) -> Result<bool, DbError> {
        self.rec.event_seq = at(seqs, self.refs.call);
        self.rec.result_event_seq = at(seqs, self.refs.result);
        self.rec.review_event_seq = at(seqs, self.refs.review);
        let (s, q, f, t) = (&self.session_id, self.seq, self.from, self.to);
        self.row = advance_tx(tx, s, q, f, t, &self.rec).await?;
        Ok(self.row.is_some())
    }
}

/// The seq of one event of a call written after the fact (its row was
/// recorded without it). Declines when the seq is stored already: the
/// event would be a second copy.
pub struct SetRef {
    pub which: EventRef,
    pub session_id: String,
    pub seq: u64,
}

#[async_trait::async_trait]
impl Joined for SetRef {
    async fn write(&mut self, tx: &mut Tx, seqs: &[u64]) -> Result<bool, DbError> {
        let Some(&ev) = seqs.first() else {
            return Ok(true);
        };
        Ok(set_ref_tx(tx, self.which, &self.session_id, self.seq, ev).await? == 1)
    }
}
