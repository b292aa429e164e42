//! Recomputes a chain from any store's events, in seq order, and reports
//! the first event that does not fit: edited (its hash no longer matches),
//! deleted (a gap in seq), reordered or moved (seq or prev_hash out of
//! place). Deleting or rewriting the *tail* leaves a consistent shorter
//! chain; [`check_anchors`] catches that against heads anchored earlier.

use crate::event::{to_hex, Hash, StoredEvent, GENESIS};
use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum Problem {
    /// The stored hash is not SHA-256(prev || canonical(event)): the event
    /// (or its hash) was edited.
    HashMismatch,
    /// The event's prev_hash is not the previous event's hash.
    PrevHashMismatch,
    /// seq is not the next one: events were deleted or reordered.
    SeqGap { found: u64 },
    /// The event names another chain.
    WrongChain { found: String },
    /// The event's data cannot be hashed (a non-integer number).
    Unhashable { error: String },
    /// An anchored head is not in the chain (truncated or rewritten tail).
    AnchorMismatch { anchored_hash: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BadEvent {
    /// The first seq that does not verify (for a gap, the missing one).
    pub seq: u64,
    #[serde(flatten)]
    pub problem: Problem,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Head {
    pub chain: String,
    pub seq: u64,
    pub hash: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    pub chain: String,
    /// Events checked before the first bad one (all of them when ok).
    pub verified: u64,
    /// The last good event.
    pub head: Option<Head>,
    pub first_bad: Option<BadEvent>,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.first_bad.is_none()
    }
}

/// Verifies one chain. `events` must come in the store's seq order (the
/// order is part of what is checked). Stops at the first bad event; a store
/// error ends the walk with that error.
pub fn verify<E>(
    chain: &str,
    events: impl IntoIterator<Item = Result<StoredEvent, E>>,
) -> Result<Report, E> {
    let mut prev: Hash = GENESIS;
    let mut expected: u64 = 1;
    let mut head = None;
    for item in events {
        let s = item?;
        let bad = |problem| BadEvent {
            seq: expected,
            problem,
        };
        let problem = if s.event.chain != chain {
            Some(Problem::WrongChain {
                found: s.event.chain.clone(),
            })
        } else if s.event.seq != expected {
            Some(Problem::SeqGap { found: s.event.seq })
        } else if s.prev_hash != prev {
            Some(Problem::PrevHashMismatch)
        } else {
            match s.event.hash(&prev) {
                Err(e) => Some(Problem::Unhashable {
                    error: e.to_string(),
                }),
                Ok(h) if h != s.hash => Some(Problem::HashMismatch),
                Ok(_) => None,
            }
        };
        if let Some(p) = problem {
            return Ok(Report {
                chain: chain.to_string(),
                verified: expected - 1,
                head,
                first_bad: Some(bad(p)),
            });
        }
        prev = s.hash;
        head = Some(Head {
            chain: chain.to_string(),
            seq: expected,
            hash: to_hex(&s.hash),
        });
        expected += 1;
    }
    Ok(Report {
        chain: chain.to_string(),
        verified: expected - 1,
        head,
        first_bad: None,
    })
}

/// Checks a verified chain against heads anchored earlier: each anchored
/// (seq, hash) must be the hash of that seq in the chain now. `hash_at`
/// looks a seq's stored hash up (the chain verified, so stored = computed).
pub fn check_anchors(
    report: &mut Report,
    anchors: &[Head],
    mut hash_at: impl FnMut(u64) -> Option<String>,
) {
    if !report.ok() {
        return;
    }
    let mut worst: Option<BadEvent> = None;
    for a in anchors.iter().filter(|a| a.chain == report.chain) {
        if hash_at(a.seq).as_deref() != Some(a.hash.as_str()) {
            let bad = BadEvent {
                seq: a.seq,
                problem: Problem::AnchorMismatch {
                    anchored_hash: a.hash.clone(),
                },
            };
            if !matches!(&worst, Some(w) if w.seq <= bad.seq) {
                worst = Some(bad);
            }
        }
    }
    report.first_bad = worst;
}
