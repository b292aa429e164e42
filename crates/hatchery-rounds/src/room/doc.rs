//! The room's shared document: one Yjs document per candidate session,
//! a root map `files` of `path → Y.Text` (what `y-codemirror.next` binds
//! each editor tab to). The server seeds it once from the session's
//! files; after that only clients' updates change it, and what Run and
//! Submit use is read from it here.
//!
//! Client bytes are hostile: decoding and applying run under
//! `catch_unwind`, so a yrs panic on a crafted update costs that
//! connection (and a reload of the room from its log), never the daemon.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use yrs::updates::decoder::Decode;
use yrs::{
    Doc, GetString, Map, MapPrelim, Out, ReadTxn, StateVector, TextPrelim, Transact, Update,
};

/// The root map every client binds to.
pub const FILES: &str = "files";

#[derive(Debug, thiserror::Error)]
pub enum DocError {
    #[error("malformed update: {0}")]
    Decode(#[source] yrs::encoding::read::Error),
    #[error("update refused: {0}")]
    Apply(#[source] yrs::error::UpdateError),
    #[error("the update crashed the decoder")]
    Panicked,
}

/// A new server-side document. Garbage collection stays on: the log, not
/// the live document, is what playback replays.
pub fn new_doc() -> Doc {
    Doc::new()
}

/// The update that seeds an empty document with `files`: the log's
/// entry 0, so the log alone rebuilds the document.
pub fn seed_update(files: &BTreeMap<String, String>) -> Vec<u8> {
    let doc = new_doc();
    let map = doc.get_or_insert_map(FILES);
    {
        let mut txn = doc.transact_mut();
        for (p, text) in files {
            map.insert(&mut txn, p.as_str(), TextPrelim::new(text.as_str()));
        }
        // Keeps the map itself present even with no files.
        if files.is_empty() {
            map.insert(&mut txn, ".room", MapPrelim::default());
            map.remove(&mut txn, ".room");
        }
    }
    let txn = doc.transact();
    txn.encode_state_as_update_v1(&StateVector::default())
}

/// Applies one client update (Yjs v1 encoding) to `doc`.
pub fn apply(doc: &Doc, update: &[u8]) -> Result<(), DocError> {
    let r = catch_unwind(AssertUnwindSafe(|| -> Result<(), DocError> {
        let u = Update::decode_v1(update).map_err(DocError::Decode)?;
        doc.transact_mut().apply_update(u).map_err(DocError::Apply)
    }));
    r.unwrap_or(Err(DocError::Panicked))
}

/// What the document holds past `sv` (the sync step 2 answer).
pub fn diff(doc: &Doc, sv: &StateVector) -> Vec<u8> {
    doc.transact().encode_diff_v1(sv)
}

/// The whole document as one update.
pub fn full_state(doc: &Doc) -> Vec<u8> {
    doc.transact()
        .encode_state_as_update_v1(&StateVector::default())
}

/// The files the document holds now, `{path: text}`. An entry that is
/// not a text (a client put something else under `files`) is skipped.
pub fn files(doc: &Doc) -> BTreeMap<String, String> {
    let txn = doc.transact();
    let mut out = BTreeMap::new();
    if let Some(map) = txn.get_map(FILES) {
        for (k, v) in map.iter(&txn) {
            if let Out::YText(t) = v {
                out.insert(k.to_string(), t.get_string(&txn));
            }
        }
    }
    out
}

/// The document after the first `n` updates of a log, for playback.
pub fn replay<'a>(updates: impl IntoIterator<Item = &'a [u8]>) -> Result<Doc, DocError> {
    let doc = new_doc();
    for u in updates {
        apply(&doc, u)?;
    }
    Ok(doc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use yrs::Text;

    fn fs(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn seed_then_edit_reads_back() {
        let server = new_doc();
        let seed = seed_update(&fs(&[("main.py", "print(1)\n")]));
        apply(&server, &seed).unwrap();
        assert_eq!(files(&server), fs(&[("main.py", "print(1)\n")]));
        // A client syncs from the server, types, and sends its update.
        let client = new_doc();
        apply(&client, &full_state(&server)).unwrap();
        let before = client.transact().state_vector();
        {
            let map = client.get_or_insert_map(FILES);
            let mut txn = client.transact_mut();
            let Some(Out::YText(t)) = map.get(&txn, "main.py") else {
                panic!("no text")
            };
            t.insert(&mut txn, 0, "# hi\n");
        }
        let up = client.transact().encode_diff_v1(&before);
        apply(&server, &up).unwrap();
        assert_eq!(files(&server)["main.py"], "# hi\nprint(1)\n");
        // The log replays to the same files.
        let log = [seed, up];
        let again = replay(log.iter().map(Vec::as_slice)).unwrap();
        assert_eq!(files(&again)["main.py"], "# hi\nprint(1)\n");
    }

    #[test]
    fn garbage_is_refused_and_the_doc_is_unchanged() {
        let server = new_doc();
        apply(&server, &seed_update(&fs(&[("a", "x")]))).unwrap();
        for bad in [
            &b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"[..],
            b"\x01",
            b"",
        ] {
            let _ = apply(&server, bad);
            assert_eq!(files(&server), fs(&[("a", "x")]));
        }
        assert!(apply(&server, b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff").is_err());
    }

    #[test]
    fn empty_seed_has_no_files() {
        let d = new_doc();
        apply(&d, &seed_update(&BTreeMap::new())).unwrap();
        assert!(files(&d).is_empty());
    }
}
