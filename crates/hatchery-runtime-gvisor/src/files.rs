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

/// The guest's command that writes the archive to stdout: every entry of
/// the root and `/tmp` (both overlays on the sandbox's disk) whose status
/// changed after `since_s`, sockets and fifos left out (meaningless
/// without their processes). `tar` exits 1 when a file changed while it
/// was read: still an archive.
pub(crate) fn export_script(since_s: u64) -> String {
    let prune: Vec<String> = SKIP.iter().map(|p| format!("-path {p}")).collect();
    format!(
        "find / /tmp -xdev \\( {} \\) -prune -o -newerct @{since_s} ! -type s ! -type p -print0 \
         | tar --null --no-recursion --numeric-owner -cf - -T - 2>/dev/null; \
         s=$?; [ $s -le 1 ] || exit $s",
        prune.join(" -o ")
    )
}

/// The guest's command that unpacks the archive from stdin over `/`,
/// keeping owners and modes, never onto a skipped path.
pub(crate) fn import_args() -> Vec<String> {
    // `--anchored`: a pattern names a path from `/` (and everything below
    // it), not any component anywhere (tar's default would also drop a
    // user's own `~/dev`).
    let mut a: Vec<String> = [
        "tar",
        "-x",
        "-p",
        "--numeric-owner",
        "-C",
        "/",
        "-f",
        "-",
        "--anchored",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for p in SKIP {
        a.push(format!("--exclude=.{p}"));
        a.push(format!("--exclude={}", &p[1..]));
    }
    a
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
    let err = String::from_utf8_lossy(stderr);
    if err.contains("not found") || err.contains("does not exist") {
        return RuntimeError::NotFound(id.to_string());
    }
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
pub(crate) async fn export(
    runsc: &Path,
    flags: &[String],
    id: &str,
    since_ms: u64,
    dest: &Path,
    max_bytes: u64,
) -> Result<u64, RuntimeError> {
    let out = tokio::time::timeout(
        FILES_TIMEOUT,
        export_to(runsc, flags, id, since_ms, dest, max_bytes),
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

async fn export_to(
    runsc: &Path,
    flags: &[String],
    id: &str,
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
    let mut total: u64 = 0;
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = stdout.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        total += n as u64;
        if total > max_bytes {
            let _ = child.start_kill();
            let _ = child.wait().await;
            return Err(RuntimeError::TooLarge { limit: max_bytes });
        }
        file.write_all(&buf[..n]).await?;
    }
    file.sync_all().await?;
    let status = child.wait().await?;
    let stderr = errs.await.unwrap_or_default();
    if !status.success() {
        return Err(failed("file export", id, status, &stderr));
    }
    Ok(total)
}

/// Unpacks `src` into sandbox `id`; see `Runtime::import_files`.
pub(crate) async fn import(
    runsc: &Path,
    flags: &[String],
    id: &str,
    src: &Path,
) -> Result<(), RuntimeError> {
    let fut = async {
        let mut file = tokio::fs::File::open(src).await?;
        let mut child = runsc_exec(runsc, flags, id)
            .args(import_args())
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
        let copied = tokio::io::copy(&mut file, &mut stdin).await;
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
        assert!(s.starts_with("find / /tmp -xdev"));
    }

    #[test]
    fn the_import_never_writes_a_skipped_path() {
        let a = import_args();
        assert_eq!(&a[..2], &["tar", "-x"]);
        let anchored = a.iter().position(|x| x == "--anchored").unwrap();
        let first_exclude = a.iter().position(|x| x.starts_with("--exclude")).unwrap();
        assert!(
            anchored < first_exclude,
            "--anchored must come first: {a:?}"
        );
        assert!(a.contains(&"--exclude=./proc".to_string()));
        assert!(a.contains(&"--exclude=opt/hatchery".to_string()));
        assert!(a.contains(&"--exclude=etc/resolv.conf".to_string()));
    }
}
