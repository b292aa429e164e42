//! Checkpoint images on disk: a template's warm checkpoint and every sandbox
//! snapshot. An image is a directory written by the runtime, then *sealed*:
//! each file's SHA-256 goes into `manifest.json` and permissions drop to
//! 0600/0700, because a snapshot is a recording of a person's work. Before
//! a restore the image is verified against its manifest, so a truncated,
//! emptied or bit-flipped image is a typed error, never a half-restored
//! sandbox. An image this process verified and that has not changed since
//! is not read again (verified.rs).

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

const MANIFEST: &str = "manifest.json";

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("image {0} not found")]
    NotFound(String),
    #[error("image {id} is corrupt: {why}")]
    Corrupt { id: String, why: String },
    #[error("invalid image id {0:?}")]
    InvalidId(String),
    #[error("image i/o: {0}")]
    Io(#[from] std::io::Error),
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct Manifest {
    files: BTreeMap<String, FileSum>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct FileSum {
    size: u64,
    sha256: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SealedImage {
    pub dir: PathBuf,
    pub size_bytes: u64,
}

/// A directory of images, one subdirectory per id.
#[derive(Debug, Clone)]
pub struct ImageStore {
    dir: PathBuf,
}

pub(crate) fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 80
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn sha256_file(p: &Path) -> std::io::Result<(u64, String)> {
    let mut f = std::fs::File::open(p)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut n = 0u64;
    loop {
        let k = f.read(&mut buf)?;
        if k == 0 {
            break;
        }
        n += k as u64;
        h.update(&buf[..k]);
    }
    Ok((n, h.finalize().iter().map(|b| format!("{b:02x}")).collect()))
}

/// Checksums every file the runtime wrote into `dir`, drops permissions
/// and writes the manifest. With `durable`, every file, the manifest and
/// the directory are fsynced too: what a shared store needs before it
/// renames the image into view of other hosts.
pub(crate) fn seal_dir(dir: &Path, id: &str, durable: bool) -> Result<SealedImage, ImageError> {
    let mut files = BTreeMap::new();
    let mut total = 0;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name == MANIFEST || !e.file_type()?.is_file() {
            continue;
        }
        std::fs::set_permissions(e.path(), std::fs::Permissions::from_mode(0o600))?;
        let (size, sha256) = sha256_file(&e.path())?;
        if durable {
            std::fs::File::open(e.path())?.sync_all()?;
        }
        total += size;
        files.insert(name, FileSum { size, sha256 });
    }
    if files.is_empty() {
        return Err(ImageError::Corrupt {
            id: id.into(),
            why: "runtime wrote no files".into(),
        });
    }
    let m = serde_json::to_vec_pretty(&Manifest { files }).map_err(std::io::Error::other)?;
    let mp = dir.join(MANIFEST);
    std::fs::write(&mp, m)?;
    std::fs::set_permissions(&mp, std::fs::Permissions::from_mode(0o600))?;
    if durable {
        std::fs::File::open(&mp)?.sync_all()?;
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(SealedImage {
        dir: dir.to_path_buf(),
        size_bytes: total,
    })
}

/// Checks every file of the image in `dir` against its manifest.
pub(crate) fn verify_dir(dir: &Path, id: &str) -> Result<(), ImageError> {
    let raw = match std::fs::read(dir.join(MANIFEST)) {
        Ok(r) => r,
        Err(_) if !dir.exists() => return Err(ImageError::NotFound(id.into())),
        Err(e) => {
            return Err(ImageError::Corrupt {
                id: id.into(),
                why: format!("manifest unreadable: {e}"),
            })
        }
    };
    let corrupt = |why: String| ImageError::Corrupt { id: id.into(), why };
    let m: Manifest =
        serde_json::from_slice(&raw).map_err(|e| corrupt(format!("manifest: {e}")))?;
    let names: Vec<&str> = m
        .files
        .keys()
        .map(String::as_str)
        .chain([MANIFEST])
        .collect();
    // Checksummed before by this process and unchanged since (verified.rs).
    if crate::verified::still_verified(dir, &names) {
        return Ok(());
    }
    for (name, want) in &m.files {
        let (size, sum) =
            sha256_file(&dir.join(name)).map_err(|e| corrupt(format!("{name}: {e}")))?;
        if size != want.size {
            return Err(corrupt(format!(
                "{name} is {size} bytes, expected {}",
                want.size
            )));
        }
        if sum != want.sha256 {
            return Err(corrupt(format!("{name} checksum mismatch")));
        }
    }
    crate::verified::remember(dir, &names);
    Ok(())
}

impl ImageStore {
    pub fn new(dir: impl Into<PathBuf>) -> std::io::Result<Self> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        Ok(ImageStore { dir })
    }

    pub fn path(&self, id: &str) -> Result<PathBuf, ImageError> {
        if !valid_id(id) {
            return Err(ImageError::InvalidId(id.to_string()));
        }
        Ok(self.dir.join(id))
    }

    /// A fresh, empty, private directory for the runtime to write into.
    pub fn prepare(&self, id: &str) -> Result<PathBuf, ImageError> {
        let p = self.path(id)?;
        crate::verified::forget(&p);
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir(&p)?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700))?;
        Ok(p)
    }

    /// Checksums what the runtime wrote and locks it down.
    pub fn seal(&self, id: &str) -> Result<SealedImage, ImageError> {
        seal_dir(&self.path(id)?, id, false)
    }

    /// The image's directory, if every file matches its manifest.
    pub fn verify(&self, id: &str) -> Result<PathBuf, ImageError> {
        let dir = self.path(id)?;
        verify_dir(&dir, id)?;
        Ok(dir)
    }

    /// Whether the image is there and sealed (its manifest written), without
    /// checksumming it: cheap enough for every heartbeat.
    pub fn is_sealed(&self, id: &str) -> bool {
        self.path(id)
            .map(|d| d.join(MANIFEST).is_file())
            .unwrap_or(false)
    }

    pub fn remove(&self, id: &str) -> Result<(), ImageError> {
        let p = self.path(id)?;
        crate::verified::forget(&p);
        match std::fs::remove_dir_all(p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
            _ => Ok(()),
        }
    }

    pub fn ids(&self) -> Vec<String> {
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return vec![];
        };
        rd.flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store in a scratch directory, removed when the test ends.
    fn store() -> (tempfile::TempDir, ImageStore) {
        let d = tempfile::Builder::new()
            .prefix("hx-img-")
            .tempdir()
            .unwrap();
        let s = ImageStore::new(d.path().to_path_buf()).unwrap();
        (d, s)
    }

    #[test]
    fn a_remembered_image_is_checked_again_once_it_changes() {
        // An image verified once is not hashed again while unchanged
        // (verified.rs); a later same-size rewrite must still be caught.
        let (_dir, s) = store();
        let d = s.prepare("snap_r").unwrap();
        std::fs::write(d.join("pages.img"), vec![1u8; 4096]).unwrap();
        s.seal("snap_r").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(2300));
        assert!(s.verify("snap_r").is_ok());
        assert!(s.verify("snap_r").is_ok());
        std::fs::write(d.join("pages.img"), vec![2u8; 4096]).unwrap();
        assert!(matches!(
            s.verify("snap_r"),
            Err(ImageError::Corrupt { .. })
        ));
    }

    #[test]
    fn seal_verify_and_detect_damage() {
        let (_dir, s) = store();
        let d = s.prepare("snap_a").unwrap();
        std::fs::write(d.join("checkpoint.img"), vec![7u8; 10_000]).unwrap();
        let sealed = s.seal("snap_a").unwrap();
        assert_eq!(sealed.size_bytes, 10_000);
        let mode = std::fs::metadata(d.join("checkpoint.img"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);
        assert!(s.verify("snap_a").is_ok());

        // bit flip
        let mut data = std::fs::read(d.join("checkpoint.img")).unwrap();
        data[5000] ^= 1;
        std::fs::write(d.join("checkpoint.img"), &data).unwrap();
        assert!(matches!(
            s.verify("snap_a"),
            Err(ImageError::Corrupt { .. })
        ));
        // truncated
        std::fs::write(d.join("checkpoint.img"), &data[..100]).unwrap();
        assert!(matches!(
            s.verify("snap_a"),
            Err(ImageError::Corrupt { .. })
        ));
        // emptied
        std::fs::write(d.join("checkpoint.img"), b"").unwrap();
        assert!(matches!(
            s.verify("snap_a"),
            Err(ImageError::Corrupt { .. })
        ));

        assert!(matches!(
            s.verify("snap_none"),
            Err(ImageError::NotFound(_))
        ));
        assert!(matches!(s.path("../x"), Err(ImageError::InvalidId(_))));
        s.remove("snap_a").unwrap();
        s.remove("snap_a").unwrap();
        assert!(!d.exists());
    }

    #[test]
    fn sealing_nothing_is_an_error() {
        let (_dir, s) = store();
        s.prepare("empty").unwrap();
        assert!(matches!(s.seal("empty"), Err(ImageError::Corrupt { .. })));
    }
}
