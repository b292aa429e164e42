//! The check every API crate's `tests/openapi_snapshot.rs` makes: the
//! OpenAPI document generated from code equals the one committed under
//! `docs/`, which the SDKs follow. A change to an API shows up as a diff to
//! review and commit (`UPDATE_SNAPSHOTS=1` writes the new document).

use std::path::Path;

/// Pins `generated` to `doc` (a path from the workspace root, such as
/// `docs/openapi.json`); `manifest_dir` is the calling crate's
/// `CARGO_MANIFEST_DIR`. Panics, naming the file, when they differ.
pub fn pin(manifest_dir: &str, doc: &str, generated: &str) {
    let path = Path::new(manifest_dir).join("../..").join(doc);
    let generated = format!("{generated}\n");
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&path, &generated)
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{doc} is stale; rerun with UPDATE_SNAPSHOTS=1 and review the diff"
    );
}
