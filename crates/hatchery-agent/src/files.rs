//! Filesystem operations inside the sandbox. Path policy (absolute, no `..`,
//! size caps) is enforced by the host before a request gets here; since the
//! agent only ever sees the sandbox's own filesystem, a symlink can at worst
//! lead to another file of the same sandbox.
//!
//! Reads and writes only ever touch regular files. Every open is
//! `O_NONBLOCK` (so opening a FIFO cannot block) and is followed by an fstat
//! of what was actually opened: pipes, sockets, devices and the agent's own
//! descriptors (its channel to the host is fd 0/1) are refused with
//! `not_a_regular_file`. Without this, `/proc/self/fd/0` would have the agent
//! read its own channel and take the sandbox down.

use crate::out::Out;
use hatchery_agent_proto::{
    FileEntry, FileListRequest, FilePathRequest, FileReadRequest, FileWriteRequest, Frame,
    GuestError, Kind,
};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

const CHUNK: usize = 256 * 1024;

pub fn guest_error(e: &io::Error) -> GuestError {
    let code = match e.kind() {
        io::ErrorKind::NotFound => "not_found",
        io::ErrorKind::IsADirectory => "is_a_directory",
        io::ErrorKind::NotADirectory => "not_a_directory",
        io::ErrorKind::PermissionDenied => "permission_denied",
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded => "no_space",
        // ENXIO: a FIFO opened for writing without a reader, a socket
        // reached through /proc; ELOOP from O_NOFOLLOW on a magic link.
        _ if matches!(e.raw_os_error(), Some(libc::ENXIO) | Some(libc::ELOOP)) => {
            "not_a_regular_file"
        }
        _ if e.get_ref().is_some_and(|i| i.is::<NotRegular>()) => "not_a_regular_file",
        _ => "io",
    };
    GuestError::new(code, e.to_string())
}

/// The marker error for "this is not a regular file".
#[derive(Debug)]
struct NotRegular(String);

impl std::fmt::Display for NotRegular {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NotRegular {}

fn not_regular(what: impl Into<String>) -> io::Error {
    io::Error::other(NotRegular(what.into()))
}

fn descriptor_link(path: &str) -> io::Error {
    not_regular(format!(
        "{path}: descriptor links are not reachable through the files API"
    ))
}

/// `/proc/<pid>/fd/N`, `/proc/<pid>/task/<tid>/fd/N`, `/dev/fd/N`,
/// `/dev/std{in,out,err}`: descriptor links, which for the agent lead to its
/// own channel. Refused by name before anything is opened; a symlink planted
/// elsewhere that leads to one is caught by the fstat checks after the open.
fn is_descriptor_link(path: &str) -> bool {
    let c: Vec<&str> = path.split('/').skip(1).collect();
    matches!(
        c.as_slice(),
        ["proc", _, "fd" | "fdinfo", _, ..]
            | ["proc", _, "task", _, "fd" | "fdinfo", _, ..]
            | ["dev", "fd", _, ..]
            | ["dev", "stdin" | "stdout" | "stderr"]
    )
}

/// Whether `md` (of a file just opened as `fd`) is one of the agent's own
/// open descriptors: its channel, its log, anything it holds.
fn is_own_descriptor(fd: i32, md: &fs::Metadata) -> bool {
    let Ok(dir) = fs::read_dir("/proc/self/fd") else {
        return false;
    };
    for e in dir.flatten() {
        let Some(n) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        if n == fd {
            continue;
        }
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: fstat on a descriptor number writes into our stat buffer;
        // a number closed meanwhile just fails.
        if unsafe { libc::fstat(n, st.as_mut_ptr()) } != 0 {
            continue;
        }
        // SAFETY: fstat succeeded, so the buffer is initialized.
        let st = unsafe { st.assume_init() };
        if st.st_dev == md.dev() && st.st_ino == md.ino() {
            return true;
        }
    }
    false
}

/// Opens `path` for a read or a write without ever blocking on it, and
/// keeps it only if it is a regular file that is not the agent's own.
fn open_regular(path: &str, write: Option<u32>) -> io::Result<File> {
    if is_descriptor_link(path) {
        return Err(descriptor_link(path));
    }
    let mut opts = OpenOptions::new();
    match write {
        Some(mode) => opts.write(true).create(true).mode(mode & 0o7777),
        None => opts.read(true),
    };
    opts.custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC);
    let f = opts.open(path)?;
    let md = f.metadata()?;
    let ft = md.file_type();
    if ft.is_dir() {
        return Err(io::Error::from(io::ErrorKind::IsADirectory));
    }
    if !ft.is_file() {
        let what = if ft.is_fifo() {
            "a FIFO"
        } else if ft.is_socket() {
            "a socket"
        } else if ft.is_char_device() {
            "a character device"
        } else if ft.is_block_device() {
            "a block device"
        } else {
            "not a regular file"
        };
        return Err(not_regular(format!(
            "{path} is {what}; only regular files can be read or written"
        )));
    }
    use std::os::fd::AsRawFd;
    if is_own_descriptor(f.as_raw_fd(), &md) {
        return Err(not_regular(format!(
            "{path}: the agent's own descriptors are not reachable through the files API"
        )));
    }
    // Regular files ignore O_NONBLOCK, but clear it anyway.
    // SAFETY: fcntl on a descriptor we own.
    unsafe {
        let fl = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
        if fl >= 0 {
            libc::fcntl(f.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK);
        }
    }
    if write.is_some() {
        f.set_len(0)?;
    }
    Ok(f)
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
            if is_descriptor_link(&req.path) {
                return Err(descriptor_link(&req.path));
            }
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent)?;
            }
            open_regular(&req.path, Some(req.mode))
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
        let mut f = open_regular(&req.path, None)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_links_by_name() {
        for p in [
            "/proc/self/fd/0",
            "/proc/1/fd/1",
            "/proc/thread-self/fd/3",
            "/proc/1/task/1/fd/0",
            "/dev/fd/0",
            "/dev/stdin",
            "/proc/self/fdinfo/0",
        ] {
            assert!(is_descriptor_link(p), "{p}");
        }
        for p in [
            "/proc/self/status",
            "/tmp/fd/0",
            "/dev/null",
            "/proc/1/cmdline",
        ] {
            assert!(!is_descriptor_link(p), "{p}");
        }
    }

    #[test]
    fn special_files_are_refused_without_blocking() {
        let dir = std::env::temp_dir().join(format!("hx-files-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let p = fifo.to_str().unwrap();
        for w in [None, Some(0o644)] {
            let e = open_regular(p, w).unwrap_err();
            assert_eq!(guest_error(&e).code, "not_a_regular_file", "{e}");
        }
        let e = open_regular("/dev/zero", None).unwrap_err();
        assert_eq!(guest_error(&e).code, "not_a_regular_file");
        let reg = dir.join("f");
        fs::write(&reg, b"x").unwrap();
        // Our own open descriptor to it makes it unreachable.
        let held = File::open(&reg).unwrap();
        let e = open_regular(reg.to_str().unwrap(), None).unwrap_err();
        assert_eq!(guest_error(&e).code, "not_a_regular_file");
        drop(held);
        assert!(open_regular(reg.to_str().unwrap(), None).is_ok());
        fs::remove_dir_all(&dir).unwrap();
    }
}
