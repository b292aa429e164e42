//! Filesystem-only pauses: the guest's changed files out of one sandbox
//! (`export`) and into another (`import`), without its memory.
//!
//! runsc 20240729 cannot serialise an overlay's upper layer (it lives in
//! a file the Sentry formats itself, `--overlay2=all:dir=`), so both halves
//! run inside the sandbox with `runsc exec`: `find` + `tar` from the
//! template (Debian's essential packages). Whatever they print is decided
//! by the guest, so the host only pipes it, counts it against the cap and
//! stores it; it never unpacks it. Unpacking happens inside the sandbox
//! being resumed, so a hostile archive can only harm that sandbox.
//!
//! Deletions: the guest also lists every path it still has under `/`; the
//! host walks the template's rootfs (its own, trusted copy) and records
//! the rootfs paths the guest no longer has. The export file is the tar,
//! then those paths (NUL-separated), then a trailer: the two lengths and
//! a magic. The import unpacks the tar and removes those paths, in the
//! sandbox.

use hatchery_runtime::RuntimeError;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

/// A whole disk's worth of files goes through a pipe; generous, but bounded.
pub(crate) const FILES_TIMEOUT: Duration = Duration::from_secs(120);

/// Paths never saved nor restored: the runtime's own mounts (`-xdev`
/// already keeps `find` off them, but prints the mount points), the agent,
/// and what the runtime and the agent write at every boot for the
/// sandbox's own network slot.
const SKIP: &[&str] = &[
    "/proc",
    "/sys",
    "/dev",
    "/opt/hatchery",
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/hostname",
];

/// The guest's command that writes, to stdout, every path it has under
/// `/` (NUL-terminated; `/tmp`'s lower layer is empty, so nothing there
/// can have been deleted), an empty entry, then the archive: every entry
/// of the root and `/tmp` (both overlays on the sandbox's disk) whose
/// status changed after `since_s`, sockets and fifos left out
/// (meaningless without their processes). `tar` exits 1 when a file
/// changed while it was read: still an archive.
pub(crate) fn export_script(since_s: u64) -> String {
    let prune: Vec<String> = SKIP.iter().map(|p| format!("-path {p}")).collect();
    let prune = prune.join(" -o ");
    format!(
        "find / -xdev \\( {prune} -o -path /tmp \\) -prune -o -print0 || exit 3; printf '\\0'; \
         find / /tmp -xdev \\( {prune} \\) -prune -o -newerct @{since_s} ! -type s ! -type p -print0 \
         | tar --null --no-recursion --numeric-owner -cf - -T - 2>/dev/null; \
         s=$?; [ $s -le 1 ] || exit $s"
    )
}

/// The guest's command that reads `tar_len` bytes of archive from stdin
/// and unpacks them over `/`, keeping owners and modes, never onto a
/// skipped path; then removes the NUL-separated paths that follow (the
/// deletions). `head -c` first: `tar` alone would read past its archive.
pub(crate) fn import_script(tar_len: u64) -> String {
    // `--anchored`: a pattern names a path from `/` (and everything below
    // it), not any component anywhere (tar's default would also drop a
    // user's own `~/dev`).
    let mut excludes = String::new();
    for p in SKIP {
        excludes.push_str(&format!(" --exclude=.{p} --exclude={}", &p[1..]));
    }
    format!(
        "head -c {tar_len} | tar -x -p --numeric-owner -C / -f - --anchored{excludes} || exit $?; \
         xargs -0 -r rm -rf --"
    )
}

/// What follows the tar in an export: the deletions' length, the tar's
/// length (both u64, big-endian), then this.
const MAGIC: &[u8; 8] = b"HXFILES1";
const TRAILER: usize = 8 + 8 + MAGIC.len();

/// Most bytes the guest's path list may take (about 300,000 paths of 200
/// bytes): past it the export fails rather than hold it all in memory.
const MAX_LISTING: usize = 64 << 20;

/// The rootfs paths (`/`-rooted, NUL-terminated) the guest no longer has:
/// `present` is the guest's list. A deleted directory is one entry (its
/// removal takes what is under it). Paths the guest cannot see (under
/// [`SKIP`], or in `/tmp`, which has a lower layer of its own) never are.
pub(crate) fn deletions(rootfs: &Path, present: &[u8]) -> std::io::Result<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    let have: std::collections::HashSet<&[u8]> = present
        .split(|b| *b == 0)
        .filter(|p| !p.is_empty())
        .collect();
    let mut out = Vec::new();
    let mut stack = vec![(rootfs.to_path_buf(), b"".to_vec())];
    while let Some((dir, rel)) = stack.pop() {
        for e in std::fs::read_dir(&dir)? {
            let e = e?;
            let mut path = rel.clone();
            path.push(b'/');
            path.extend_from_slice(e.file_name().as_bytes());
            let hidden = path == b"/tmp"
                || SKIP.iter().any(|s| {
                    path == s.as_bytes()
                        || (path.starts_with(s.as_bytes()) && path[s.len()] == b'/')
                });
            if hidden {
                continue;
            }
            if !have.contains(path.as_slice()) {
                out.extend_from_slice(&path);
                out.push(0);
            } else if e.file_type()?.is_dir() {
                stack.push((e.path(), path));
            }
        }
    }
    Ok(out)
}

fn runsc_exec(runsc: &Path, flags: &[String], id: &str) -> Command {
    let mut c = Command::new(runsc);
    c.args(flags)
        .args(["exec", "--user", "0:0", "--cwd", "/"])
        .arg(id)
        .kill_on_drop(true);
    c
}

fn failed(what: &str, id: &str, status: std::process::ExitStatus, stderr: &[u8]) -> RuntimeError {
    // Not read for "not found": the guest writes this stderr too (the core
    // has checked that the sandbox runs).
    let err = String::from_utf8_lossy(stderr);
    // The guest's words stay in the log: they are not ours to show.
    let tail: String = err
        .chars()
        .rev()
        .take(400)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    tracing::warn!(sandbox = %id, %status, stderr = %tail, "{what} failed");
    RuntimeError::Other(format!("{what} of {id} failed ({status})"))
}

/// Writes the archive of sandbox `id`'s changed files to `dest` (created
/// here), at most `max_bytes`; see `Runtime::export_files`.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn export(
    runsc: &Path,
    flags: &[String],
    id: &str,
    rootfs: &Path,
    since_ms: u64,
    dest: &Path,
    max_bytes: u64,
) -> Result<u64, RuntimeError> {
    let out = tokio::time::timeout(
        FILES_TIMEOUT,
        export_to(runsc, flags, id, rootfs, since_ms, dest, max_bytes),
    )
    .await
    .unwrap_or_else(|_| {
        Err(RuntimeError::Other(format!(
            "file export of {id} timed out"
        )))
    });
    if out.is_err() {
        let _ = std::fs::remove_file(dest);
    }
    out
}

#[allow(clippy::too_many_arguments)]
async fn export_to(
    runsc: &Path,
    flags: &[String],
    id: &str,
    rootfs: &Path,
    since_ms: u64,
    dest: &Path,
    max_bytes: u64,
) -> Result<u64, RuntimeError> {
    // A second of slack: the guest's clock and ours may round apart, and
    // saving a file twice costs nothing.
    let since_s = (since_ms / 1000).saturating_sub(1);
    let mut child = runsc_exec(runsc, flags, id)
        .args(["/bin/sh", "-c", &export_script(since_s)])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut stdout = child
        .stdout
        .take()
        .ok_or_else(|| RuntimeError::Other("no stdout from runsc exec".into()))?;
    let mut stderr = child
        .stderr
        .take()
        .ok_or_else(|| RuntimeError::Other("no stderr from runsc exec".into()))?;
    let errs = tokio::spawn(async move {
        let mut b = Vec::new();
        let _ = (&mut stderr).take(64 * 1024).read_to_end(&mut b).await;
        b
    });
    let mut file = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(dest)
        .await?;
    // First the guest's path list, up to its empty entry; then the tar.
    let mut listing: Vec<u8> = Vec::new();
    let mut listed = false;
    let mut total: u64 = 0;
    let mut tar_len: u64 = 0;
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = stdout.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        total += n as u64;
        if total > max_bytes || listing.len() > MAX_LISTING {
            let _ = child.start_kill();
            let _ = child.wait().await;
            return Err(RuntimeError::TooLarge { limit: max_bytes });
        }
        let mut chunk = &buf[..n];
        if !listed {
            let start = listing.len();
            listing.extend_from_slice(chunk);
            // The end is an empty entry: a NUL right after a NUL (the
            // first path, `/`, is never empty).
            let end =
                (start.max(1)..listing.len()).find(|&i| listing[i] == 0 && listing[i - 1] == 0);
            let Some(end) = end else { continue };
            listed = true;
            chunk = &chunk[end + 1 - start..];
            listing.truncate(end);
        }
        tar_len += chunk.len() as u64;
        file.write_all(chunk).await?;
    }
    let status = child.wait().await?;
    let stderr = errs.await.unwrap_or_default();
    if !status.success() {
        return Err(failed("file export", id, status, &stderr));
    }
    if !listed {
        return Err(RuntimeError::Other(format!(
            "file export of {id}: no path list from the guest"
        )));
    }
    let root = rootfs.to_path_buf();
    let gone = tokio::task::spawn_blocking(move || deletions(&root, &listing))
        .await
        .map_err(|e| RuntimeError::Other(e.to_string()))??;
    let size = tar_len + (gone.len() + TRAILER) as u64;
    if size > max_bytes {
        return Err(RuntimeError::TooLarge { limit: max_bytes });
    }
    file.write_all(&gone).await?;
    file.write_all(&(gone.len() as u64).to_be_bytes()).await?;
    file.write_all(&tar_len.to_be_bytes()).await?;
    file.write_all(MAGIC).await?;
    file.sync_all().await?;
    Ok(size)
}

/// The tar's and the deletions' lengths from an export's trailer.
fn trailer(src: &Path) -> Result<(u64, u64), RuntimeError> {
    use std::io::{Read, Seek, SeekFrom};
    let bad = || RuntimeError::Other(format!("{} is not a files export", src.display()));
    let mut f = std::fs::File::open(src)?;
    let size = f.metadata()?.len();
    if size < TRAILER as u64 {
        return Err(bad());
    }
    f.seek(SeekFrom::Start(size - TRAILER as u64))?;
    let mut t = [0u8; TRAILER];
    f.read_exact(&mut t)?;
    if &t[16..] != MAGIC {
        return Err(bad());
    }
    let gone = u64::from_be_bytes(t[..8].try_into().map_err(|_| bad())?);
    let tar = u64::from_be_bytes(t[8..16].try_into().map_err(|_| bad())?);
    if tar
        .checked_add(gone)
        .and_then(|x| x.checked_add(TRAILER as u64))
        != Some(size)
    {
        return Err(bad());
    }
    Ok((tar, gone))
}

/// Unpacks `src` into sandbox `id`; see `Runtime::import_files`.
pub(crate) async fn import(
    runsc: &Path,
    flags: &[String],
    id: &str,
    src: &Path,
) -> Result<(), RuntimeError> {
    let fut = async {
        let (tar_len, gone_len) = trailer(src)?;
        let file = tokio::fs::File::open(src).await?;
        let mut child = runsc_exec(runsc, flags, id)
            .args(["/bin/sh", "-c", &import_script(tar_len)])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        let mut stdin = child
            .stdin
            .take()
            .ok_or_else(|| RuntimeError::Other("no stdin to runsc exec".into()))?;
        // Copied by the host, not handed over as a descriptor: the guest
        // gets bytes, never a handle on a host file.
        let copied = tokio::io::copy(&mut file.take(tar_len + gone_len), &mut stdin).await;
        drop(stdin);
        let out = child.wait_with_output().await?;
        if !out.status.success() {
            return Err(failed("file import", id, out.status, &out.stderr));
        }
        copied?;
        Ok(())
    };
    tokio::time::timeout(FILES_TIMEOUT, fut)
        .await
        .unwrap_or_else(|_| {
            Err(RuntimeError::Other(format!(
                "file import into {id} timed out"
            )))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_export_skips_the_runtimes_paths_and_dead_ends() {
        let s = export_script(1_700_000_000);
        assert!(s.contains("-newerct @1700000000"), "{s}");
        for p in SKIP {
            assert!(s.contains(&format!("-path {p}")), "{p} not pruned: {s}");
        }
        assert!(s.contains("! -type s ! -type p"));
        // The path list first (ended by an empty entry), then the archive.
        assert!(s.starts_with("find / -xdev"), "{s}");
        assert!(s.contains("printf '\\0'; find / /tmp -xdev"), "{s}");
    }

    #[test]
    fn the_import_never_writes_a_skipped_path() {
        let s = import_script(4096);
        assert!(s.starts_with("head -c 4096 | tar -x"), "{s}");
        let anchored = s.find("--anchored").unwrap();
        assert!(
            anchored < s.find("--exclude").unwrap(),
            "--anchored must come first: {s}"
        );
        for p in [
            "--exclude=./proc",
            "--exclude=opt/hatchery",
            "--exclude=etc/resolv.conf",
        ] {
            assert!(s.contains(p), "{p}: {s}");
        }
        assert!(s.ends_with("xargs -0 -r rm -rf --"), "{s}");
    }

    #[test]
    fn deletions_are_the_rootfs_paths_the_guest_lost() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        for d in [
            "etc",
            "usr/share/doc/a",
            "usr/bin",
            "proc/1",
            "tmp/x",
            "opt/hatchery",
        ] {
            std::fs::create_dir_all(r.join(d)).unwrap();
        }
        for f in [
            "etc/motd",
            "etc/passwd",
            "usr/bin/tar",
            "usr/share/doc/a/README",
            "etc/hosts",
        ] {
            std::fs::write(r.join(f), b"x").unwrap();
        }
        // The guest lost /etc/motd and the whole of /usr/share/doc; what
        // it cannot see (/proc, /tmp, /opt/hatchery, /etc/hosts) is never
        // a deletion.
        let present =
            b"/\0/opt\0/etc\0/etc/passwd\0/usr\0/usr/bin\0/usr/bin/tar\0/usr/share\0/new\0";
        let mut gone: Vec<&[u8]> = Vec::new();
        let out = deletions(r, present).unwrap();
        gone.extend(out.split(|b| *b == 0).filter(|p| !p.is_empty()));
        gone.sort();
        assert_eq!(gone, vec![&b"/etc/motd"[..], &b"/usr/share/doc"[..]]);
    }

    #[test]
    fn a_trailer_is_checked_against_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("e");
        let mut b = vec![7u8; 10];
        b.extend_from_slice(b"/gone\0");
        b.extend_from_slice(&6u64.to_be_bytes());
        b.extend_from_slice(&10u64.to_be_bytes());
        b.extend_from_slice(MAGIC);
        std::fs::write(&p, &b).unwrap();
        assert_eq!(trailer(&p).unwrap(), (10, 6));
        b.insert(0, 1);
        std::fs::write(&p, &b).unwrap();
        assert!(trailer(&p).is_err(), "lengths that do not add up");
        std::fs::write(&p, b"short").unwrap();
        assert!(trailer(&p).is_err());
    }
}
