//! The broker's writes that commit with the session events they record,
//! in one transaction (hatchery_db::Joined, issue 32): a call's row never
//! says an event was written that is not in the log, and the log never
//! holds a call's event twice because a crash fell between two commits.
//! Each step names which of the events just appended (by index) it
//! stores the seq of; a step whose guard fails (the call moved on, the key
//! was taken, the seq was stored already) declines, and the events roll
//! back with it.
//!
//! On the control role the events are written by the session's owning
//! host, so the write travels with them: a [`BrokerWrite`] is posted with
//! the events and the owner commits both in its transaction on the shared
//! database ([`Decoder`] is how it reads one back).

use super::db::{advance_tx, insert_tx, row_call, set_ref_tx};
use super::{Call, CallState, EventRef, Recorded, StoreError};
use hatchery_db::{DbError, Joined, Row, Tx};
use serde::{Deserialize, Serialize};

/// The seq of the `i`th event appended, if there is one (the control
/// role's log may not know every seq of a post it repeated).
fn at(seqs: &[u64], i: Option<usize>) -> Option<u64> {
    i.and_then(|i| seqs.get(i).copied())
}

/// Which appended event (by index) is the call's `broker_call`, its
/// result, or the resolution of its review.
#[derive(Debug, Default, Clone, Copy, Serialize, Deserialize)]
pub struct Refs {
    pub call: Option<usize>,
    pub result: Option<usize>,
    pub review: Option<usize>,
}

/// A new call's row, inserted with its events (a call decided at once:
/// denied, effect-free, or waiting for an approval). Declines when the
/// key is taken.
#[derive(Debug, Serialize, Deserialize)]
pub struct Insert {
    call: Call,
    refs: Refs,
    #[serde(skip)]
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
#[derive(Debug, Serialize, Deserialize)]
pub struct Advance {
    session_id: String,
    seq: u64,
    from: CallState,
    to: CallState,
    rec: Recorded,
    refs: Refs,
    #[serde(skip)]
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
#[derive(Debug, Serialize, Deserialize)]
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

/// One of the broker's joined writes, as the session log takes it: run in
/// the log's transaction here, or posted with the events to the session's
/// owner (the control role), which runs it in its own.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum BrokerWrite {
    Insert(Insert),
    Advance(Advance),
    SetRef(SetRef),
}

impl BrokerWrite {
    /// The session whose call it writes: the owner refuses a write for a
    /// call of another session than the one it is posted to.
    pub fn session_id(&self) -> &str {
        match self {
            BrokerWrite::Insert(i) => &i.call.session_id,
            BrokerWrite::Advance(a) => &a.session_id,
            BrokerWrite::SetRef(s) => &s.session_id,
        }
    }

    pub fn into_insert(self) -> Option<Insert> {
        match self {
            BrokerWrite::Insert(i) => Some(i),
            _ => None,
        }
    }

    pub fn into_advance(self) -> Option<Advance> {
        match self {
            BrokerWrite::Advance(a) => Some(a),
            _ => None,
        }
    }
}

#[async_trait::async_trait]
impl Joined for BrokerWrite {
    async fn write(&mut self, tx: &mut Tx, seqs: &[u64]) -> Result<bool, DbError> {
        match self {
            BrokerWrite::Insert(i) => i.write(tx, seqs).await,
            BrokerWrite::Advance(a) => a.write(tx, seqs).await,
            BrokerWrite::SetRef(s) => s.write(tx, seqs).await,
        }
    }
}

/// How a session's owning host reads the write a remote broker posted
/// with its events (set on its sessions service by the daemon).
pub struct Decoder;

/// Why an owner refuses a broker write posted with events.
#[derive(Debug, thiserror::Error)]
pub enum DecodeRefused {
    #[error("not a broker write")]
    Unreadable(#[source] serde_json::Error),
    #[error("no move from {from:?} to {to:?}")]
    NoSuchMove { from: CallState, to: CallState },
    #[error("the write is for a call of session {of}, not {posted_to}")]
    OtherSession { of: String, posted_to: String },
}

impl Decoder {
    /// The write in `write`, if it is a move of the call graph for a call
    /// of `session`.
    pub fn write_of(
        &self,
        session: &str,
        write: serde_json::Value,
    ) -> Result<BrokerWrite, DecodeRefused> {
        let w: BrokerWrite = serde_json::from_value(write).map_err(DecodeRefused::Unreadable)?;
        if let BrokerWrite::Advance(a) = &w {
            if !a.from.valid_transition(a.to) {
                return Err(DecodeRefused::NoSuchMove {
                    from: a.from,
                    to: a.to,
                });
            }
        }
        if w.session_id() != session {
            return Err(DecodeRefused::OtherSession {
                of: w.session_id().to_string(),
                posted_to: session.to_string(),
            });
        }
        Ok(w)
    }
}

impl hatchery_sessions::broker_hooks::RemoteJoined for Decoder {
    fn decode(
        &self,
        session: &str,
        write: serde_json::Value,
    ) -> Result<Box<dyn Joined>, hatchery_sessions::broker_hooks::JoinedRefused> {
        Ok(Box::new(self.write_of(session, write)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hatchery_sessions::broker_hooks::RemoteJoined;

    fn insert(session: &str) -> BrokerWrite {
        let c = Call::new(session, 3, 1, "noop", "{}".into(), "sha".into());
        BrokerWrite::Insert(Insert::new(c, Refs::default()))
    }

    #[test]
    fn the_owner_reads_back_the_write_the_broker_posted() {
        let w = serde_json::to_value(insert("ses_a")).unwrap();
        assert!(Decoder.decode("ses_a", w.clone()).is_ok());
        // A write for another session's call is refused, whoever posts it.
        let e = Decoder.write_of("ses_b", w).unwrap_err();
        assert!(
            matches!(&e, DecodeRefused::OtherSession { of, .. } if of == "ses_a"),
            "{e}"
        );
        // No move outside the graph, even from a daemon.
        let c = Call::new("ses_a", 3, 1, "noop", "{}".into(), "sha".into());
        let bad = BrokerWrite::Advance(Advance {
            session_id: c.session_id,
            seq: 3,
            from: CallState::Done,
            to: CallState::Executing,
            rec: Recorded::default(),
            refs: Refs::default(),
            row: None,
        });
        let e = Decoder
            .write_of("ses_a", serde_json::to_value(bad).unwrap())
            .unwrap_err();
        assert!(matches!(e, DecodeRefused::NoSuchMove { .. }), "{e}");
        // Unknown shapes are refused, not ignored.
        let junk = serde_json::json!({"drop_table": {"session_id": "ses_a"}});
        assert!(matches!(
            Decoder.write_of("ses_a", junk),
            Err(DecodeRefused::Unreadable(_))
        ));
    }
}
