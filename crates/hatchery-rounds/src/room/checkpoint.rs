//! Playback checkpoints: the document's whole state stored beside its
//! log (`round_doc_checkpoints`), so the document at entry `at` is the
//! nearest checkpoint at or before `at` plus the entries after it, not
//! the whole log replayed again on every scrub.
//!
//! Checkpoints are taken from the log, never from a live room: a replay
//! that passes the spacing below (from the nearest checkpoint, or from the
//! start) records the state there, and playback stores them. Entries up to
//! a stored index never change (the log is append only and each `idx` is
//! taken once), so a checkpoint stays right until retention deletes it
//! with its log. Nothing is added to the typing path.
//!
//! Spacing and bounds: a checkpoint comes at least
//! [`DOC_CHECKPOINT_MIN_ENTRIES`] entries after the previous one, and
//! only when its state is at most twice the update bytes since the
//! previous one (so they total at most twice the log); the store holds a
//! session to [`MAX_DOC_CHECKPOINTS`] and [`MAX_DOC_CHECKPOINT_BYTES`]
//! whatever the spacing gave.

use super::doc::{self, DocError};
use crate::limits::{DOC_CHECKPOINT_MIN_ENTRIES, MAX_DOC_CHECKPOINTS, MAX_DOC_CHECKPOINT_BYTES};
use yrs::Doc;

/// A state to start from: a checkpoint's state, and the log's bytes up
/// to its entry.
pub struct Start<'a> {
    pub state: &'a [u8],
    pub log_bytes: u64,
}

/// A checkpoint a replay passed: the state right after entry `idx`.
#[derive(Debug, Clone, PartialEq)]
pub struct Taken {
    pub idx: u64,
    pub state: Vec<u8>,
    pub log_bytes: u64,
}

/// The document after a replay, and the checkpoints it passed.
pub struct Rebuilt {
    pub doc: Doc,
    pub taken: Vec<Taken>,
    /// The log's update bytes up to the last entry replayed.
    pub log_bytes: u64,
}

/// The document from `start` (or empty) with `tail` (`(idx, update)` in
/// log order, markers' empty bodies included) applied, recording a
/// checkpoint wherever the spacing allows.
pub fn rebuild<'a>(
    start: Option<Start<'_>>,
    tail: impl IntoIterator<Item = (u64, &'a [u8])>,
) -> Result<Rebuilt, DocError> {
    let doc = doc::new_doc();
    let (mut prev_len, mut log_bytes) = (0u64, 0u64);
    if let Some(s) = &start {
        doc::apply(&doc, s.state)?;
        prev_len = s.state.len() as u64;
        log_bytes = s.log_bytes;
    }
    let mut taken = Vec::new();
    let mut taken_bytes = 0u64;
    // Past the caps this replay records nothing more.
    let mut full = false;
    // Since the previous checkpoint: entries passed, and update bytes.
    let (mut entries, mut bytes) = (0u64, 0u64);
    for (idx, u) in tail {
        if !u.is_empty() {
            doc::apply(&doc, u)?;
        }
        entries += 1;
        bytes += u.len() as u64;
        log_bytes += u.len() as u64;
        // Cheap test first: a state is about the previous one plus what
        // came since, so encode only once that could be within 2x.
        if full || entries < DOC_CHECKPOINT_MIN_ENTRIES || bytes < prev_len {
            continue;
        }
        let state = doc::full_state(&doc);
        let len = state.len() as u64;
        if len > 2 * bytes {
            // Not yet worth its room: look again after as many entries.
            entries = 0;
            continue;
        }
        if taken.len() >= MAX_DOC_CHECKPOINTS || taken_bytes + len > MAX_DOC_CHECKPOINT_BYTES {
            full = true;
            continue;
        }
        taken_bytes += len;
        prev_len = len;
        (entries, bytes) = (0, 0);
        taken.push(Taken {
            idx,
            state,
            log_bytes,
        });
    }
    Ok(Rebuilt {
        doc,
        taken,
        log_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::room::doc::{files, seed_update, FILES};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use std::collections::BTreeMap;
    use yrs::{GetString, Map, Out, ReadTxn, Text, TextPrelim, Transact};

    /// A log as the room writes it: a seed, then updates from a few
    /// clients typing, deleting, adding and removing files concurrently
    /// (each client sees the others' edits late), with empty Run/Submit
    /// markers between. Now and then an update is logged after the next
    /// one from its client, which depends on it (yrs holds that one as
    /// pending until the first arrives).
    fn random_log(seed: u64, n: usize) -> Vec<Vec<u8>> {
        let mut rng = StdRng::seed_from_u64(seed);
        let start: BTreeMap<String, String> = [("main.py", "print(1)\n"), ("util.py", "")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut log = vec![seed_update(&start)];
        // Each client and how far into the log it has read.
        let mut clients: Vec<(Doc, usize)> = (0..3).map(|_| (doc::new_doc(), 0)).collect();
        let mut held: Option<Vec<u8>> = None;
        while log.len() < n {
            let r = rng.gen_range(0..100);
            if r < 5 {
                log.push(Vec::new());
                continue;
            }
            let k = rng.gen_range(0..clients.len());
            let (c, read) = &mut clients[k];
            // Late delivery: it reads up to a random point it has not passed.
            let upto = rng.gen_range(*read..=log.len());
            for u in &log[*read..upto] {
                if !u.is_empty() {
                    doc::apply(c, u).unwrap();
                }
            }
            *read = upto;
            let before = c.transact().state_vector();
            {
                let map = c.get_or_insert_map(FILES);
                let mut txn = c.transact_mut();
                let names: Vec<String> = map.keys(&txn).map(str::to_string).collect();
                if r < 9 || names.is_empty() {
                    let p = format!("f{}.py", rng.gen_range(0..4));
                    map.insert(&mut txn, p, TextPrelim::new("x = 1\n"));
                } else if r < 11 {
                    let p = &names[rng.gen_range(0..names.len())];
                    map.remove(&mut txn, p);
                } else {
                    let p = &names[rng.gen_range(0..names.len())];
                    if let Some(Out::YText(t)) = map.get(&txn, p) {
                        // Offsets are bytes: only at character boundaries.
                        let text = t.get_string(&txn);
                        let mut cuts: Vec<u32> =
                            text.char_indices().map(|(i, _)| i as u32).collect();
                        cuts.push(text.len() as u32);
                        if cuts.len() > 1 && rng.gen_bool(0.3) {
                            let a = rng.gen_range(0..cuts.len() - 1);
                            let b = rng.gen_range(a + 1..cuts.len().min(a + 6));
                            t.remove_range(&mut txn, cuts[a], cuts[b] - cuts[a]);
                        } else {
                            let at = cuts[rng.gen_range(0..cuts.len())];
                            let words = ["a", "bc", "\n", "é", "def f():\n    ", "🦀"];
                            t.insert(&mut txn, at, words[rng.gen_range(0..words.len())]);
                        }
                    }
                }
            }
            let u = c.transact().encode_diff_v1(&before);
            if held.is_none() && k == 0 && rng.gen_bool(0.05) {
                held = Some(u);
                continue;
            }
            log.push(u);
            if k == 0 {
                log.extend(held.take());
            }
        }
        log.truncate(n);
        log
    }

    /// The files after each entry, the way the full rebuild gets them:
    /// every update from the seed on applied in order to one document.
    fn full_each(log: &[Vec<u8>]) -> Vec<BTreeMap<String, String>> {
        let d = doc::new_doc();
        let mut out = Vec::new();
        for u in log {
            if !u.is_empty() {
                doc::apply(&d, u).unwrap();
            }
            out.push(files(&d));
        }
        out
    }

    fn full(log: &[Vec<u8>], at: usize) -> BTreeMap<String, String> {
        let d = doc::replay(
            log[..=at]
                .iter()
                .map(Vec::as_slice)
                .filter(|b| !b.is_empty()),
        )
        .unwrap();
        files(&d)
    }

    /// Playback as the route does it: from the last checkpoint at or
    /// before `at`, collecting new ones into `store`.
    fn via_checkpoints(
        log: &[Vec<u8>],
        store: &mut BTreeMap<u64, Taken>,
        at: usize,
    ) -> BTreeMap<String, String> {
        let cp = store
            .range(..=at as u64)
            .next_back()
            .map(|(_, c)| c.clone());
        let from = cp.as_ref().map_or(0, |c| c.idx as usize + 1);
        let start = cp.as_ref().map(|c| Start {
            state: &c.state,
            log_bytes: c.log_bytes,
        });
        let tail = (from..=at).map(|i| (i as u64, log[i].as_slice()));
        let r = rebuild(start, tail).unwrap();
        let want: u64 = log[..=at].iter().map(|u| u.len() as u64).sum();
        assert_eq!(r.log_bytes, want, "log bytes at {at}");
        for t in r.taken {
            store.entry(t.idx).or_insert(t);
        }
        files(&r.doc)
    }

    #[test]
    fn playback_from_checkpoints_equals_the_full_rebuild() {
        for seed in 0..4 {
            let log = random_log(seed, 1500);
            let want = full_each(&log);
            let mut rng = StdRng::seed_from_u64(seed + 100);
            let mut store = BTreeMap::new();
            // Scrubs in random order (the end among them), then every
            // entry in turn.
            let mut ats: Vec<usize> = (0..60).map(|_| rng.gen_range(0..log.len())).collect();
            ats.push(log.len() - 1);
            for &at in &ats {
                // The route's own full rebuild, at these.
                assert_eq!(full(&log, at), want[at], "seed {seed}, at {at}");
            }
            ats.extend(0..log.len());
            for at in ats {
                assert_eq!(
                    via_checkpoints(&log, &mut store, at),
                    want[at],
                    "seed {seed}, at {at}"
                );
            }
            assert!(store.len() >= 2, "seed {seed}: {} checkpoints", store.len());
            let first = store.keys().next().copied().unwrap();
            assert!(first + 1 >= DOC_CHECKPOINT_MIN_ENTRIES, "spacing");
            for (a, b) in store.keys().zip(store.keys().skip(1)) {
                assert!(b - a >= DOC_CHECKPOINT_MIN_ENTRIES, "{a} then {b}");
            }
        }
    }

    #[test]
    fn the_log_with_pending_updates_replays_the_same() {
        // An update logged before the one it depends on stays pending in
        // yrs; a checkpoint taken in between must carry it.
        let base = doc::new_doc();
        let seed = seed_update(&BTreeMap::from([("a".to_string(), "x".to_string())]));
        doc::apply(&base, &seed).unwrap();
        let sv0 = base.transact().state_vector();
        let edit = |d: &Doc, s: &str| {
            let map = d.get_or_insert_map(FILES);
            let mut txn = d.transact_mut();
            let Some(Out::YText(t)) = map.get(&txn, "a") else {
                panic!()
            };
            t.push(&mut txn, s);
        };
        edit(&base, "1");
        let first = base.transact().encode_diff_v1(&sv0);
        let sv1 = base.transact().state_vector();
        edit(&base, "2");
        let second = base.transact().encode_diff_v1(&sv1);
        let mut log = vec![seed, second];
        log.extend((0..DOC_CHECKPOINT_MIN_ENTRIES as usize).map(|_| Vec::new()));
        // Lots of bytes before the pending one resolves, so the spacing
        // takes a checkpoint while `second` is pending.
        log[2] = vec![0, 0];
        log.push(first);
        let mut store = BTreeMap::new();
        let end = log.len() - 1;
        assert_eq!(
            via_checkpoints(&log, &mut store, end - 1),
            full(&log, end - 1)
        );
        assert_eq!(full(&log, end)["a"], "x12");
        assert_eq!(via_checkpoints(&log, &mut store, end), full(&log, end));
    }

    #[test]
    fn a_checkpoint_is_no_larger_than_twice_what_it_replaces() {
        // A large seed, then single keystrokes: after the first
        // checkpoint the next waits until the keystrokes' bytes reach the
        // document's size, and none is more than twice what it covers.
        let d = doc::new_doc();
        let big = "y".repeat(64 << 10);
        let mut log = vec![seed_update(&BTreeMap::from([("a".to_string(), big)]))];
        doc::apply(&d, &log[0]).unwrap();
        for i in 0..6000u32 {
            let sv = d.transact().state_vector();
            {
                let map = d.get_or_insert_map(FILES);
                let mut txn = d.transact_mut();
                let Some(Out::YText(t)) = map.get(&txn, "a") else {
                    panic!()
                };
                t.insert(&mut txn, i % 100, "k");
            }
            log.push(d.transact().encode_diff_v1(&sv));
        }
        let r = rebuild(
            None,
            log.iter()
                .enumerate()
                .map(|(i, u)| (i as u64, u.as_slice())),
        )
        .unwrap();
        assert!(!r.taken.is_empty());
        let mut prev = (0u64, 0u64);
        for t in &r.taken {
            let since = t.log_bytes - prev.1;
            assert!(
                t.state.len() as u64 <= 2 * since,
                "{} > 2 x {since}",
                t.state.len()
            );
            assert!(t.idx + 1 - prev.0 >= DOC_CHECKPOINT_MIN_ENTRIES);
            prev = (t.idx, t.log_bytes);
        }
        assert_eq!(files(&r.doc), files(&d));
    }
}
