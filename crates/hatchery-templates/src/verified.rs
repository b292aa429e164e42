//! Images this process has already checksummed, so that the next restore
//! of the same, unchanged image does not read all of it again.
//!
//! Why: a fork and a session start from an environment restore the same
//! snapshot over and over, and `verify_dir` hashed every byte of it each
//! time (tens to hundreds of milliseconds for an environment's image, on a
//! path whose goal is 150-500 ms in all). What the checksum guards
//! against is an image that changed or broke on disk since it was sealed:
//! a partial copy, a truncation, another host's rewrite in a shared
//! store. Any such write through the filesystem changes a file's ctime
//! (which no caller can set back) or its inode, so a file whose identity,
//! size, mtime and ctime are what they were when it last hashed correctly
//! is that same file.
//!
//! Racy stat: the kernel stamps times at its tick (a few ms), so a file
//! rewritten within one tick of its verification could keep its times.
//! As git does for its index, a file whose ctime is not at least
//! [`SETTLED`] older than the verification is not remembered; it is hashed
//! again next time.
//!
//! Not covered, as before this cache too: a bit flipped by the disk under
//! an unchanged inode. The first restore on each host (and on each daemon
//! start) still hashes everything.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How much older than its verification a file's ctime must be for the
/// verification to be remembered.
const SETTLED: Duration = Duration::from_secs(2);
/// Images remembered at most; past it the memory is dropped whole (the
/// next verifications hash again).
const MAX_IMAGES: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

fn stamp(p: &Path) -> Option<Stamp> {
    let m = std::fs::symlink_metadata(p).ok()?;
    if !m.is_file() {
        return None;
    }
    let ns = |s: i64, n: i64| s as i128 * 1_000_000_000 + n as i128;
    Some(Stamp {
        dev: m.dev(),
        ino: m.ino(),
        len: m.len(),
        mtime_ns: ns(m.mtime(), m.mtime_nsec()),
        ctime_ns: ns(m.ctime(), m.ctime_nsec()),
    })
}

type Stamps = Vec<(String, Stamp)>;

fn memory() -> &'static Mutex<HashMap<PathBuf, Stamps>> {
    static M: OnceLock<Mutex<HashMap<PathBuf, Stamps>>> = OnceLock::new();
    M.get_or_init(Default::default)
}

fn now_ns() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0)
}

/// Whether `dir` was verified with exactly these files (`names`, the
/// manifest's, plus the manifest itself) and none of them changed since.
pub(crate) fn still_verified(dir: &Path, names: &[&str]) -> bool {
    let m = memory().lock().unwrap_or_else(|p| p.into_inner());
    let Some(known) = m.get(dir) else {
        return false;
    };
    known.len() == names.len()
        && known
            .iter()
            .all(|(n, s)| names.contains(&n.as_str()) && stamp(&dir.join(n)).as_ref() == Some(s))
}

/// Remembers that `dir`'s files `names` hashed correctly just now, unless
/// one of them changed too recently to be told apart from a rewrite.
pub(crate) fn remember(dir: &Path, names: &[&str]) {
    let settled_before = now_ns() - SETTLED.as_nanos() as i128;
    let mut stamps = Vec::with_capacity(names.len());
    for n in names {
        match stamp(&dir.join(n)) {
            Some(s) if s.ctime_ns < settled_before && s.mtime_ns < settled_before => {
                stamps.push((n.to_string(), s))
            }
            _ => return,
        }
    }
    let mut m = memory().lock().unwrap_or_else(|p| p.into_inner());
    if m.len() >= MAX_IMAGES {
        m.clear();
    }
    m.insert(dir.to_path_buf(), stamps);
}

/// Forgets `dir` (it is being replaced or removed).
pub(crate) fn forget(dir: &Path) {
    memory()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(dir);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aged(p: &Path) {
        // Back-date mtime; ctime cannot be set, so these tests age files
        // by waiting where they need a settled ctime.
        let old = SystemTime::now() - Duration::from_secs(60);
        let f = std::fs::File::options().write(true).open(p).unwrap();
        f.set_modified(old).unwrap();
    }

    #[test]
    fn a_fresh_file_is_not_remembered() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("a"), b"x").unwrap();
        aged(&d.path().join("a"));
        remember(d.path(), &["a"]);
        // Its ctime is from just now: a rewrite in the same tick could
        // not be told apart.
        assert!(!still_verified(d.path(), &["a"]));
    }

    #[test]
    fn a_settled_file_is_remembered_until_it_changes() {
        let d = tempfile::tempdir().unwrap();
        let a = d.path().join("a");
        std::fs::write(&a, b"xxxx").unwrap();
        aged(&a);
        std::thread::sleep(SETTLED + Duration::from_millis(200));
        remember(d.path(), &["a"]);
        assert!(still_verified(d.path(), &["a"]));
        // Another set of names is another image.
        assert!(!still_verified(d.path(), &["a", "b"]));
        // Same size, rewritten: its ctime moved.
        std::fs::write(&a, b"yyyy").unwrap();
        assert!(!still_verified(d.path(), &["a"]));
        forget(d.path());
        assert!(!still_verified(d.path(), &["a"]));
    }
}
