//! Filesystem operations inside the sandbox. Path policy (absolute, no `..`,
//! size caps) is enforced by the host before a request gets here; since the
//! agent only ever sees the sandbox's own filesystem, a symlink can at worst
//! lead to another file of the same sandbox.

use crate::out::Out;
use hatchery_agent_proto::{
    FileEntry, FileListRequest, FilePathRequest, FileReadRequest, FileWriteRequest, Frame,
    GuestError, Kind,
};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

const CHUNK: usize = 256 * 1024;

pub fn guest_error(e: &io::Error) -> GuestError {
    let code = match e.kind() {
        io::ErrorKind::NotFound => "not_found",
        io::ErrorKind::IsADirectory => "is_a_directory",
        io::ErrorKind::NotADirectory => "not_a_directory",
        io::ErrorKind::PermissionDenied => "permission_denied",
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded => "no_space",
        _ => "io",
    };
    GuestError::new(code, e.to_string())
}

/// A write in progress: data frames arrive between start and end. The first
/// failure is remembered and reported at the end.
pub struct PendingWrite {
    file: Result<File, GuestError>,
}

impl PendingWrite {
    pub fn open(req: &FileWriteRequest) -> Self {
        let path = Path::new(&req.path);
        let file = (|| {
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent)?;
            }
            OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(req.mode & 0o7777)
                .open(path)
        })()
        .map_err(|e| guest_error(&e));
        PendingWrite { file }
    }

    pub fn write(&mut self, data: &[u8]) {
        if let Ok(f) = &mut self.file {
            if let Err(e) = f.write_all(data) {
                self.file = Err(guest_error(&e));
            }
        }
    }

    pub fn finish(self) -> Result<(), GuestError> {
        self.file.map(drop)
    }
}

pub fn read(chan: u32, req: FileReadRequest, out: &Out) {
    let res = (|| -> io::Result<Option<u64>> {
        let mut f = File::open(&req.path)?;
        if f.metadata()?.is_dir() {
            return Err(io::Error::from(io::ErrorKind::IsADirectory));
        }
        // Size from stat lies for /proc and devices, so count as we go.
        let mut total = 0u64;
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                return Ok(None);
            }
            total += n as u64;
            if total > req.max_bytes {
                return Ok(Some(total));
            }
            out.send(&Frame::new(chan, Kind::FileChunk, buf[..n].to_vec()));
        }
    })();
    match res {
        Ok(None) => out.send(&Frame::new(chan, Kind::FileEof, vec![])),
        Ok(Some(_)) => out.error(
            chan,
            "too_large",
            format!("file is larger than {} bytes", req.max_bytes),
        ),
        Err(e) => out.send(&Frame::json(chan, Kind::Error, &guest_error(&e))),
    }
}

pub fn list(chan: u32, req: FileListRequest, out: &Out) {
    let res = (|| -> io::Result<Vec<FileEntry>> {
        let mut entries = Vec::new();
        for e in fs::read_dir(&req.path)? {
            let e = e?;
            let Ok(md) = e.path().symlink_metadata() else {
                continue;
            };
            let ft = md.file_type();
            let kind = if ft.is_symlink() {
                "symlink"
            } else if ft.is_dir() {
                "dir"
            } else if ft.is_file() {
                "file"
            } else {
                "other"
            };
            entries.push(FileEntry {
                name: e.file_name().to_string_lossy().into_owned(),
                kind: kind.to_string(),
                size: md.len(),
                mode: md.permissions().mode() & 0o7777,
                mtime: md.mtime(),
            });
            if entries.len() >= req.max_entries as usize {
                break;
            }
        }
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(entries)
    })();
    match res {
        Ok(entries) => out.send(&Frame::json(chan, Kind::Ok, &entries)),
        Err(e) => out.send(&Frame::json(chan, Kind::Error, &guest_error(&e))),
    }
}

pub fn remove(chan: u32, req: FilePathRequest, out: &Out) {
    let path = Path::new(&req.path);
    let res = match path.symlink_metadata() {
        Ok(md) if md.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) => Err(e),
    };
    match res {
        Ok(()) => out.send(&Frame::new(chan, Kind::Ok, b"{}".to_vec())),
        Err(e) => out.send(&Frame::json(chan, Kind::Error, &guest_error(&e))),
    }
}
