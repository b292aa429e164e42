//! Where sandbox snapshots live, behind one [`SnapshotStore`] trait with
//! two backends:
//!
//! - `local`: today's `DATA_DIR/snapshots`, readable by this host only
//!   (the default);
//! - `shared`: a directory every host mounts (NFS or the like), so a
//!   snapshot taken on one host can be forked, read and deleted on any
//!   other, including after its writer is lost.
//!
//! A shared image must never be seen half-written by a reader on another
//! host: the runtime writes into a staging directory in the same parent
//! (`.staging-<id>`, a name no id can take), which is sealed (checksums,
//! manifest), fsynced and only then renamed to `<id>`; a rename within one
//! directory is atomic on POSIX filesystems and on NFS. A delete renames
//! the image out of view (`.deleting-<id>-<n>`) before removing its files,
//! so a reader sees either the whole image or none. Restores still verify
//! every file against the manifest, as for a local image.

use crate::images::{seal_dir, valid_id, verify_dir, ImageStore};
use crate::{ImageError, SealedImage};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Staging directories of shared images being written.
const STAGING: &str = ".staging-";
/// Images being deleted (already out of readers' view).
const DELETING: &str = ".deleting-";
/// Staging or deleting leftovers older than this (a host that crashed
/// mid-write or mid-delete) are removed when a store is opened; a live
/// checkpoint takes seconds to minutes, never this long.
pub const STALE_AFTER: Duration = Duration::from_secs(6 * 3600);

#[derive(Debug, thiserror::Error)]
pub enum SnapshotStoreError {
    #[error("invalid snapshot store {0:?}: use `local` or `shared:/absolute/path`")]
    InvalidSpec(String),
    #[error("snapshot store {path}: {why}")]
    Unusable { path: PathBuf, why: String },
    #[error(transparent)]
    Image(#[from] ImageError),
}

type Result<T> = std::result::Result<T, SnapshotStoreError>;

/// Which backend a store is, as recorded in a snapshot's row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotStoreKind {
    Local,
    Shared,
}

/// Where snapshot images are written, read and deleted.
pub trait SnapshotStore: Send + Sync + std::fmt::Debug {
    fn kind(&self) -> SnapshotStoreKind;
    /// A fresh, empty, private directory for the runtime to write image
    /// `id` into. Readers do not see it until [`SnapshotStore::publish`].
    fn prepare(&self, id: &str) -> Result<PathBuf>;
    /// Seals what the runtime wrote (checksums, manifest, 0600/0700) and
    /// makes it readable as `id`, all at once.
    fn publish(&self, id: &str) -> Result<SealedImage>;
    /// The image's directory, if every file matches its manifest.
    fn verify(&self, id: &str) -> Result<PathBuf>;
    /// Removes image `id`, published or not. Idempotent, and safe when
    /// several hosts remove the same image at once.
    fn remove(&self, id: &str) -> Result<()>;
    /// Ids of the published images.
    fn ids(&self) -> Vec<String>;
    /// Ids of the images published at least `age` ago (by their
    /// directory's mtime): candidates for the orphan sweep.
    fn published_before(&self, age: Duration) -> Vec<String> {
        let _ = age;
        Vec::new()
    }
}

/// What `--snapshot-store` (HATCHERY_SNAPSHOT_STORE) names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotStoreSpec {
    Local,
    Shared(PathBuf),
}

impl std::str::FromStr for SnapshotStoreSpec {
    type Err = SnapshotStoreError;

    fn from_str(s: &str) -> Result<Self> {
        let bad = || SnapshotStoreError::InvalidSpec(s.to_string());
        if s == "local" {
            return Ok(SnapshotStoreSpec::Local);
        }
        let path = s.strip_prefix("shared:").ok_or_else(bad)?;
        let p = Path::new(path);
        // Every host must name the same directory: a relative path would
        // depend on each daemon's working directory.
        if !p.is_absolute() || path.contains('\0') {
            return Err(bad());
        }
        Ok(SnapshotStoreSpec::Shared(p.to_path_buf()))
    }
}

impl SnapshotStoreSpec {
    /// Opens the store; `local_dir` is the local backend's directory.
    /// A shared directory must exist and be writable by this process: it
    /// is mounted by the operator, never created here.
    pub fn open(&self, local_dir: &Path) -> Result<Arc<dyn SnapshotStore>> {
        Ok(match self {
            SnapshotStoreSpec::Local => Arc::new(LocalSnapshots::open(local_dir)?),
            SnapshotStoreSpec::Shared(p) => Arc::new(SharedSnapshots::open(p)?),
        })
    }
}

/// `DATA_DIR/snapshots`: one host's disk.
#[derive(Debug, Clone)]
pub struct LocalSnapshots {
    images: ImageStore,
}

impl LocalSnapshots {
    pub fn open(dir: &Path) -> Result<Self> {
        let images = ImageStore::new(dir).map_err(|e| SnapshotStoreError::Unusable {
            path: dir.to_path_buf(),
            why: e.to_string(),
        })?;
        Ok(LocalSnapshots { images })
    }

    pub fn from_images(images: ImageStore) -> Self {
        LocalSnapshots { images }
    }
}

impl SnapshotStore for LocalSnapshots {
    fn kind(&self) -> SnapshotStoreKind {
        SnapshotStoreKind::Local
    }
    fn prepare(&self, id: &str) -> Result<PathBuf> {
        Ok(self.images.prepare(id)?)
    }
    fn publish(&self, id: &str) -> Result<SealedImage> {
        Ok(self.images.seal(id)?)
    }
    fn verify(&self, id: &str) -> Result<PathBuf> {
        Ok(self.images.verify(id)?)
    }
    fn remove(&self, id: &str) -> Result<()> {
        Ok(self.images.remove(id)?)
    }
    fn ids(&self) -> Vec<String> {
        self.images.ids()
    }
}

/// A directory every host mounts.
#[derive(Debug, Clone)]
pub struct SharedSnapshots {
    root: PathBuf,
}

fn unusable(root: &Path, why: impl std::fmt::Display) -> SnapshotStoreError {
    SnapshotStoreError::Unusable {
        path: root.to_path_buf(),
        why: why.to_string(),
    }
}

fn nanos() -> u128 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

fn sync_dir(p: &Path) -> std::io::Result<()> {
    std::fs::File::open(p)?.sync_all()
}

/// The names in `dir`; none if it cannot be read.
fn entries(dir: &Path) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return vec![];
    };
    let name = |e: std::fs::DirEntry| e.file_name().to_string_lossy().into_owned();
    rd.flatten().map(name).collect()
}

/// Whether `p` was last modified at least `age` ago.
fn older_than(p: &Path, age: Duration) -> bool {
    let modified = std::fs::metadata(p).and_then(|m| m.modified());
    modified
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|el| el >= age)
}

impl SharedSnapshots {
    pub fn open(root: &Path) -> Result<Self> {
        if !root.is_absolute() {
            return Err(unusable(root, "not an absolute path"));
        }
        let md = std::fs::metadata(root).map_err(|e| unusable(root, e))?;
        if !md.is_dir() {
            return Err(unusable(root, "not a directory"));
        }
        // Writable by this process, tried for real (permission bits say
        // nothing about root on a root-squashing NFS mount or a read-only
        // one).
        let probe = root.join(format!(".probe-{}-{}", std::process::id(), nanos()));
        let tried = std::fs::write(&probe, b"hatchery")
            .and_then(|_| std::fs::File::open(&probe)?.sync_all());
        let _ = std::fs::remove_file(&probe);
        tried.map_err(|e| unusable(root, format!("not writable: {e}")))?;
        let s = SharedSnapshots {
            root: root.to_path_buf(),
        };
        s.remove_stale(STALE_AFTER);
        Ok(s)
    }

    /// Image `id`'s published directory and its staging one.
    fn dirs(&self, id: &str) -> Result<(PathBuf, PathBuf)> {
        if !valid_id(id) {
            return Err(ImageError::InvalidId(id.to_string()).into());
        }
        Ok((self.root.join(id), self.root.join(format!("{STAGING}{id}"))))
    }

    /// Removes staging and deleting leftovers older than `age`: those of
    /// a host that died mid-write or mid-delete. Younger ones may be
    /// another host's write in progress.
    pub fn remove_stale(&self, age: Duration) -> usize {
        let stale = |n: &String| {
            let leftover = n.starts_with(STAGING) || n.starts_with(DELETING);
            let p = self.root.join(n);
            leftover && older_than(&p, age) && std::fs::remove_dir_all(p).is_ok()
        };
        entries(&self.root).into_iter().filter(stale).count()
    }
}

impl SnapshotStore for SharedSnapshots {
    fn kind(&self) -> SnapshotStoreKind {
        SnapshotStoreKind::Shared
    }

    fn prepare(&self, id: &str) -> Result<PathBuf> {
        let (_, p) = self.dirs(id)?;
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir(&p).map_err(ImageError::from)?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700))
            .map_err(ImageError::from)?;
        Ok(p)
    }

    fn publish(&self, id: &str) -> Result<SealedImage> {
        let (dest, staging) = self.dirs(id)?;
        let sealed = seal_dir(&staging, id, true)?;
        // rename(2) onto an existing non-empty directory fails, so a
        // published image is never replaced.
        std::fs::rename(&staging, &dest).map_err(ImageError::from)?;
        sync_dir(&self.root).map_err(ImageError::from)?;
        Ok(SealedImage {
            dir: dest,
            size_bytes: sealed.size_bytes,
        })
    }

    fn verify(&self, id: &str) -> Result<PathBuf> {
        let (dir, _) = self.dirs(id)?;
        verify_dir(&dir, id)?;
        Ok(dir)
    }

    fn remove(&self, id: &str) -> Result<()> {
        let (dir, staging) = self.dirs(id)?;
        match std::fs::remove_dir_all(&staging) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(ImageError::from(e).into())
            }
            _ => {}
        }
        // Out of view first; when two hosts race, one rename wins and the
        // other finds nothing.
        let gone = self
            .root
            .join(format!("{DELETING}{id}-{}-{}", std::process::id(), nanos()));
        match std::fs::rename(&dir, &gone) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(ImageError::from(e).into()),
        }
        std::fs::remove_dir_all(&gone).map_err(ImageError::from)?;
        sync_dir(&self.root).map_err(ImageError::from)?;
        Ok(())
    }

    fn ids(&self) -> Vec<String> {
        let mut ids = entries(&self.root);
        ids.retain(|n| valid_id(n));
        ids
    }

    fn published_before(&self, age: Duration) -> Vec<String> {
        let mut ids = self.ids();
        ids.retain(|id| older_than(&self.root.join(id), age));
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch directory, removed when the test ends.
    fn tmp(tag: &str) -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix(&format!("hx-ss-{tag}-"))
            .tempdir()
            .unwrap()
    }

    /// The image error a call failed with.
    fn image_err<T: std::fmt::Debug>(r: Result<T>) -> ImageError {
        match r {
            Err(SnapshotStoreError::Image(e)) => e,
            other => panic!("not an image error: {other:?}"),
        }
    }

    fn names(d: &Path) -> Vec<String> {
        assert!(d.is_dir(), "{d:?}");
        let mut v = entries(d);
        v.sort();
        v
    }

    #[test]
    fn specs_parse_and_bad_ones_are_refused() {
        let parse = |s: &str| s.parse::<SnapshotStoreSpec>();
        assert_eq!(parse("local").unwrap(), SnapshotStoreSpec::Local);
        let shared = SnapshotStoreSpec::Shared("/mnt/snaps".into());
        assert_eq!(parse("shared:/mnt/snaps").unwrap(), shared);
        let bad = ["", "shared", "shared:", "shared:rel/dir", "nfs:/x", "Local"];
        for bad in bad.into_iter().chain(["shared:/a\0b", " local"]) {
            let e = parse(bad);
            let refused = matches!(e, Err(SnapshotStoreError::InvalidSpec(_)));
            assert!(refused, "{bad:?}");
        }
    }

    #[test]
    fn unusable_shared_dirs_are_a_clear_error() {
        let d_dir = tmp("bad");
        let d = d_dir.path();
        let file = d.join("a-file");
        std::fs::write(&file, b"x").unwrap();
        let missing = d.join("missing");
        // /proc refuses new files even to root.
        for (p, why) in [
            (missing, "No such file"),
            (file, "not a directory"),
            ("/proc".into(), "not writable"),
        ] {
            let e = SnapshotStoreSpec::Shared(p.clone()).open(d).unwrap_err();
            let unusable = matches!(&e, SnapshotStoreError::Unusable { .. });
            assert!(unusable && e.to_string().contains(why), "{p:?}: {e}");
        }
        // Opening a good one leaves nothing behind (the probe is removed).
        let ok = tmp("ok");
        SnapshotStoreSpec::Shared(ok.path().into()).open(d).unwrap();
        assert!(names(ok.path()).is_empty());
    }

    #[test]
    fn shared_publish_is_atomic_for_readers() {
        let root_dir = tmp("pub");
        let root = root_dir.path();
        let a = SharedSnapshots::open(root).unwrap();
        // Another host's view of the same directory.
        let b = SharedSnapshots::open(root).unwrap();
        let dir = a.prepare("snap_x").unwrap();
        std::fs::write(dir.join("checkpoint.img"), vec![3u8; 50_000]).unwrap();
        // Written but not published: no reader sees it, under any name.
        let not_found =
            |s: &SharedSnapshots| matches!(image_err(s.verify("snap_x")), ImageError::NotFound(_));
        assert!(not_found(&b) && b.ids().is_empty());
        let sealed = a.publish("snap_x").unwrap();
        assert_eq!(sealed.size_bytes, 50_000);
        assert_eq!(sealed.dir, root.join("snap_x"));
        assert_eq!(names(root), ["snap_x"], "the staging dir is gone");
        assert_eq!(b.verify("snap_x").unwrap(), root.join("snap_x"));
        assert_eq!(b.ids(), ["snap_x"]);
        assert_eq!(b.published_before(Duration::ZERO), ["snap_x"]);
        assert!(b.published_before(STALE_AFTER).is_empty());
        let mode = std::fs::metadata(root.join("snap_x/checkpoint.img"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        // Damage is still caught on the reading host.
        std::fs::write(root.join("snap_x/checkpoint.img"), b"short").unwrap();
        let damaged = image_err(b.verify("snap_x"));
        assert!(matches!(damaged, ImageError::Corrupt { .. }), "{damaged}");
        // An id is published once: a second image never replaces it.
        let d2 = a.prepare("snap_x").unwrap();
        std::fs::write(d2.join("checkpoint.img"), b"other").unwrap();
        assert!(a.publish("snap_x").is_err());
        // Both hosts delete at once: one wins, neither errs, nothing is left.
        a.remove("snap_x").unwrap();
        b.remove("snap_x").unwrap();
        assert!(names(root).is_empty(), "{:?}", names(root));
        assert!(not_found(&b));
    }

    #[test]
    fn bad_ids_and_empty_images_are_refused() {
        let root_dir = tmp("ids");
        let root = root_dir.path();
        let s = SharedSnapshots::open(root).unwrap();
        for bad in ["", "../x", ".staging-a", "a/b", "a.b", &"a".repeat(81)] {
            let e = image_err(s.prepare(bad));
            assert!(matches!(e, ImageError::InvalidId(_)), "{bad:?}");
            assert!(s.verify(bad).is_err() && s.remove(bad).is_err(), "{bad:?}");
        }
        s.prepare("snap_e").unwrap();
        let e = image_err(s.publish("snap_e"));
        assert!(matches!(e, ImageError::Corrupt { .. }), "{e}");
        let verified = s.verify("snap_e");
        assert!(verified.is_err(), "an empty image is never published");
        s.remove("snap_e").unwrap();
        assert!(names(root).is_empty());
    }

    #[test]
    fn stale_leftovers_are_swept_young_ones_kept() {
        let root_dir = tmp("stale");
        let root = root_dir.path();
        let s = SharedSnapshots::open(root).unwrap();
        s.prepare("snap_w").unwrap();
        std::fs::create_dir(root.join(".deleting-snap_v-1-2")).unwrap();
        let young = s.remove_stale(STALE_AFTER);
        assert_eq!(young, 0, "another host may be writing");
        assert_eq!(s.remove_stale(Duration::ZERO), 2);
        assert!(names(root).is_empty());
    }

    #[test]
    fn local_backend_is_todays_dir() {
        let d_dir = tmp("local");
        let d = d_dir.path();
        let s = SnapshotStoreSpec::Local.open(&d.join("snapshots")).unwrap();
        assert_eq!(s.kind(), SnapshotStoreKind::Local);
        let w = s.prepare("snap_l").unwrap();
        assert_eq!(w, d.join("snapshots/snap_l"));
        std::fs::write(w.join("checkpoint.img"), b"abc").unwrap();
        assert_eq!(s.publish("snap_l").unwrap().size_bytes, 3);
        assert!(s.verify("snap_l").is_ok());
        s.remove("snap_l").unwrap();
        assert!(s.ids().is_empty());
    }
}
