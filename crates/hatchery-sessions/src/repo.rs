//! Fetching the repository on the host. The credential (an HTTP header
//! from the operator's file) is passed to this one `git fetch` in its
//! environment config only (not its argv, not a file): it is never written
//! to the checkout, and the
//! sandbox receives a plain tar of the work tree and `.git`.
//!
//! The repository is untrusted (a huge blob, a "git bomb" tree of
//! millions of paths), and git runs as the daemon's user, so the fetch is
//! bounded while it runs, not only at the end (docs/threat-model.md,
//! "5. The repository fetch"):
//!
//! * it works in a directory of its own under the daemon's data dir
//!   (`DATA_DIR/repo-fetch/`, 0700), never the host's shared `/tmp`, and
//!   removes it whatever happens (stale ones from a killed daemon are
//!   removed at start, [`clean_work_root`]);
//! * every git and tar child runs with `RLIMIT_FSIZE` = the size cap, so
//!   no single file it writes (the pack above all) can outgrow the cap;
//! * a watcher measures the directory every [`WATCH_EVERY`] and kills the
//!   step once it holds more than `max_disk` bytes or `max_files` entries;
//! * before checkout, the tree is listed (`git ls-tree -r -l`, streamed)
//!   and refused past `max_files` paths or `max_bytes` of blobs, so a git
//!   bomb is refused before one file of it is written;
//! * the tar is read with a running byte count and abandoned at the cap,
//!   so the daemon never holds more than `max_bytes` of it;
//! * the whole fetch has one deadline.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt};
use tokio::process::Command;
use tokio::time::Instant;

#[derive(Debug, thiserror::Error)]
pub enum RepoError {
    #[error("git {step} failed: {stderr}")]
    Git { step: &'static str, stderr: String },
    /// A size cap was reached while fetching (`what` says which).
    #[error("{what} is over the cap of {limit} bytes")]
    TooLarge { what: &'static str, limit: u64 },
    #[error("the repository has more than {0} paths")]
    TooManyFiles(u64),
    #[error("fetch timed out after {0:?}")]
    Timeout(Duration),
    #[error("host: {0}")]
    Io(#[from] std::io::Error),
    #[error("reading the git credential file")]
    Credential(#[source] std::io::Error),
}

/// The operator's git credential (an HTTP header line), read from its
/// file at each fetch so that a rotated file is taken at once.
pub fn read_credential(path: Option<&Path>) -> Result<Option<String>, RepoError> {
    match path {
        None => Ok(None),
        Some(p) => Ok(Some(
            std::fs::read_to_string(p)
                .map_err(RepoError::Credential)?
                .trim()
                .to_string(),
        )),
    }
}

impl RepoError {
    /// The label of `hatchery_sessions_repo_fetch_refused_total`.
    pub fn cap(&self) -> Option<&'static str> {
        match self {
            RepoError::TooLarge { what, .. } if *what == WHAT_DISK => Some("disk"),
            RepoError::TooLarge { .. } => Some("bytes"),
            RepoError::TooManyFiles(_) => Some("files"),
            RepoError::Timeout(_) => Some("timeout"),
            _ => None,
        }
    }
}

const WHAT_DISK: &str = "the fetch directory";

/// What one fetch may use.
#[derive(Debug, Clone, Copy)]
pub struct FetchLimits {
    /// Largest checkout tar (work tree and `.git`), largest file git may
    /// write, largest sum of the tree's blobs.
    pub max_bytes: u64,
    /// Most bytes the fetch directory may hold at once (pack plus work
    /// tree: about twice `max_bytes`).
    pub max_disk: u64,
    /// Most paths in the tree (and entries in the fetch directory).
    pub max_files: u64,
    /// The whole fetch, every step included.
    pub timeout: Duration,
}

impl Default for FetchLimits {
    fn default() -> Self {
        FetchLimits::for_bytes(64 << 20, 100_000)
    }
}

impl FetchLimits {
    pub fn for_bytes(max_bytes: u64, max_files: u64) -> Self {
        FetchLimits {
            max_bytes,
            // The pack and the work tree made from it, plus git's own
            // files: a repository under the tar cap always fits.
            max_disk: max_bytes.saturating_mul(2).saturating_add(4 << 20),
            max_files,
            timeout: Duration::from_secs(120),
        }
    }
}

pub struct Checkout {
    pub tar: Vec<u8>,
    pub commit: String,
}

/// How often the watcher measures the fetch directory.
pub const WATCH_EVERY: Duration = Duration::from_millis(100);

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Removes what a killed daemon's fetches left in `root` (each fetch has
/// a directory of its own there; none is in use before the runners start).
pub fn clean_work_root(root: &Path) {
    if let Ok(rd) = std::fs::read_dir(root) {
        for e in rd.flatten() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Bytes, entries and the largest file under `dir`; stops counting
/// entries past `stop_at` (a bomb need not be walked whole to be refused).
fn measure(dir: &Path, stop_at: u64) -> (u64, u64, u64) {
    let (mut bytes, mut files, mut largest) = (0u64, 0u64, 0u64);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            files += 1;
            if files > stop_at {
                return (bytes, files, largest);
            }
            let Ok(md) = e.path().symlink_metadata() else {
                continue;
            };
            if md.is_dir() {
                stack.push(e.path());
            } else {
                bytes += md.len();
                largest = largest.max(md.len());
            }
        }
    }
    (bytes, files, largest)
}

/// Entries the fetch directory may hold: each path of the tree, at most
/// as many directories, and git's own files.
fn max_entries(l: &FetchLimits) -> u64 {
    l.max_files.saturating_mul(2).saturating_add(1000)
}

/// Watches the fetch directory while a step runs; trips (and says why)
/// when it is over the disk or entry cap.
struct Watch {
    dir: PathBuf,
    limits: FetchLimits,
}

impl Watch {
    async fn check(&self) -> Result<(), RepoError> {
        let (dir, l) = (self.dir.clone(), self.limits);
        let cap = max_entries(&l);
        let (bytes, files, _) = tokio::task::spawn_blocking(move || measure(&dir, cap))
            .await
            .unwrap_or((0, 0, 0));
        if bytes > l.max_disk {
            return Err(RepoError::TooLarge {
                what: WHAT_DISK,
                limit: l.max_disk,
            });
        }
        if files > cap {
            return Err(RepoError::TooManyFiles(l.max_files));
        }
        Ok(())
    }

    /// Returns (with the reason) only once the directory is over a cap.
    async fn until_over(&self) -> RepoError {
        loop {
            tokio::time::sleep(WATCH_EVERY).await;
            if let Err(e) = self.check().await {
                return e;
            }
        }
    }
}

fn command(dir: &Path, fsize: u64) -> Command {
    let mut c = Command::new("git");
    c.arg("-C")
        .arg(dir)
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        // Only the transports the URL check allows; never ext:: or fd::.
        .env("GIT_ALLOW_PROTOCOL", "https:git:file")
        .env("HOME", dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    limit_file_size(&mut c, fsize);
    c
}

/// No file the child (or its children: index-pack, checkout) writes may
/// grow past `bytes`: a write beyond it fails (SIGXFSZ), so a huge blob
/// stops at the cap instead of at the disk's end, whatever the watcher's
/// timing.
fn limit_file_size(c: &mut Command, bytes: u64) {
    let lim = libc::rlimit {
        rlim_cur: bytes as libc::rlim_t,
        rlim_max: bytes as libc::rlim_t,
    };
    // SAFETY: setrlimit is async-signal-safe and touches no memory of the
    // parent; nothing else runs between fork and exec.
    unsafe {
        c.pre_exec(move || {
            if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

struct Fetcher<'a> {
    dir: &'a Path,
    limits: FetchLimits,
    deadline: Instant,
    watch: Watch,
}

impl Fetcher<'_> {
    fn timeout(&self) -> RepoError {
        RepoError::Timeout(self.limits.timeout)
    }

    /// One git step, under the deadline and the watcher.
    async fn git(&self, step: &'static str, args: &[&str]) -> Result<String, RepoError> {
        self.git_with(step, args, None).await
    }

    /// `git` with the operator's credential header, given through git's
    /// environment config (`GIT_CONFIG_COUNT`/`KEY_0`/`VALUE_0`), never
    /// its argv: any user on the host can read a command line in `ps`.
    async fn git_with(
        &self,
        step: &'static str,
        args: &[&str],
        header: Option<&str>,
    ) -> Result<String, RepoError> {
        let mut c = command(self.dir, self.limits.max_bytes);
        c.args(args);
        if let Some(h) = header {
            c.env("GIT_CONFIG_COUNT", "1")
                .env("GIT_CONFIG_KEY_0", "http.extraHeader")
                .env("GIT_CONFIG_VALUE_0", h);
        }
        let child = c.spawn()?;
        let out = tokio::select! {
            r = tokio::time::timeout_at(self.deadline, child.wait_with_output()) => {
                r.map_err(|_| self.timeout())??
            }
            // Dropping the child's future kills it (kill_on_drop).
            e = self.watch.until_over() => return Err(e),
        };
        if !out.status.success() {
            // A write past RLIMIT_FSIZE (a huge blob, a huge pack) shows
            // as a failed step with a file at the cap: say so.
            let (dir, l) = (self.dir.to_path_buf(), self.limits);
            let (_, _, largest) =
                tokio::task::spawn_blocking(move || measure(&dir, max_entries(&l)))
                    .await
                    .unwrap_or((0, 0, 0));
            if largest >= self.limits.max_bytes {
                return Err(RepoError::TooLarge {
                    what: "a file of the repository",
                    limit: self.limits.max_bytes,
                });
            }
            self.watch.check().await?;
            let e = String::from_utf8_lossy(&out.stderr);
            return Err(RepoError::Git {
                step,
                stderr: crate::events::cut(e.trim(), 2000).to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// [`Self::git`], its output as bytes, untrimmed (NUL-separated
    /// lists).
    async fn git_bytes(&self, step: &'static str, args: &[&str]) -> Result<Vec<u8>, RepoError> {
        let mut c = command(self.dir, self.limits.max_bytes);
        c.args(args);
        let child = c.spawn()?;
        let out = tokio::select! {
            r = tokio::time::timeout_at(self.deadline, child.wait_with_output()) => {
                r.map_err(|_| self.timeout())??
            }
            e = self.watch.until_over() => return Err(e),
        };
        if !out.status.success() {
            let e = String::from_utf8_lossy(&out.stderr);
            return Err(RepoError::Git {
                step,
                stderr: crate::events::cut(e.trim(), 2000).to_string(),
            });
        }
        Ok(out.stdout)
    }

    /// Lists the fetched tree before anything of it is written: more
    /// than `max_files` paths, or more than `max_bytes` of blobs, is
    /// refused. The listing is read as it comes and the lister killed at
    /// the cap, so a bomb's billion paths are never listed whole.
    async fn check_tree(&self, rev: &str) -> Result<(), RepoError> {
        let mut c = command(self.dir, self.limits.max_bytes);
        c.args(["ls-tree", "-r", "-l", "-z", "--full-tree", rev])
            .stderr(Stdio::null());
        let mut child = c.spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| RepoError::Io(std::io::Error::other("ls-tree has no stdout")))?;
        let mut rd = tokio::io::BufReader::new(stdout);
        let (mut paths, mut bytes) = (0u64, 0u64);
        let mut rec = Vec::new();
        let work = async {
            loop {
                rec.clear();
                // Each record ends with NUL; a path may be long, but not
                // longer than git's own limit (4096): cap the read.
                let n = (&mut rd).take(8192).read_until(0, &mut rec).await?;
                if n == 0 {
                    return Ok::<(), RepoError>(());
                }
                paths += 1;
                if paths > self.limits.max_files {
                    return Err(RepoError::TooManyFiles(self.limits.max_files));
                }
                // "<mode> <type> <object> <size>\t<path>": size is "-"
                // for a submodule.
                let head = rec.split(|b| *b == b'\t').next().unwrap_or_default();
                let size = std::str::from_utf8(head)
                    .ok()
                    .and_then(|h| h.split_ascii_whitespace().nth(3))
                    .and_then(|s| s.parse::<u64>().ok())
                    .unwrap_or(0);
                bytes = bytes.saturating_add(size);
                if bytes > self.limits.max_bytes {
                    return Err(RepoError::TooLarge {
                        what: "the repository's files",
                        limit: self.limits.max_bytes,
                    });
                }
            }
        };
        match tokio::time::timeout_at(self.deadline, work).await {
            Err(_) => Err(self.timeout()),
            Ok(Err(e)) => Err(e),
            Ok(Ok(())) => {
                let st = tokio::time::timeout_at(self.deadline, child.wait())
                    .await
                    .map_err(|_| self.timeout())??;
                if !st.success() {
                    return Err(RepoError::Git {
                        step: "ls-tree",
                        stderr: format!("exited with {st}"),
                    });
                }
                Ok(())
            }
        }
    }

    /// The checkout as a tar, read with a running count: past `max_bytes`
    /// tar is killed and nothing more is read.
    async fn tar(&self) -> Result<Vec<u8>, RepoError> {
        self.tar_of(&["."]).await
    }

    /// `what` (tar arguments naming what to pack, relative to the
    /// checkout) as a tar, with [`Self::tar`]'s running count.
    async fn tar_of(&self, what: &[&str]) -> Result<Vec<u8>, RepoError> {
        let mut c = Command::new("tar");
        c.arg("-C")
            .arg(self.dir)
            .args(["-cf", "-"])
            .args(what)
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        let mut child = c.spawn()?;
        let mut stdout = child
            .stdout
            .take()
            .ok_or_else(|| RepoError::Io(std::io::Error::other("tar has no stdout")))?;
        let max = self.limits.max_bytes;
        let read = async {
            let mut out = Vec::new();
            let mut buf = vec![0u8; 64 << 10];
            loop {
                let n = stdout.read(&mut buf).await?;
                if n == 0 {
                    return Ok::<_, RepoError>(out);
                }
                if out.len() as u64 + n as u64 > max {
                    return Err(RepoError::TooLarge {
                        what: "the checkout (as a tar)",
                        limit: max,
                    });
                }
                out.extend_from_slice(&buf[..n]);
            }
        };
        let out = tokio::time::timeout_at(self.deadline, read)
            .await
            .map_err(|_| self.timeout())??;
        let res = tokio::time::timeout_at(self.deadline, child.wait_with_output())
            .await
            .map_err(|_| self.timeout())??;
        if !res.status.success() {
            return Err(RepoError::Git {
                step: "tar",
                stderr: crate::events::cut(String::from_utf8_lossy(&res.stderr).trim(), 2000)
                    .to_string(),
            });
        }
        Ok(out)
    }
}

/// Fetches `git_ref` of `url` (depth 50) in a directory of its own under
/// `work_root` and packs it as a tar, within `limits`. The directory is
/// gone when this returns, whatever the outcome.
pub async fn fetch(
    url: &str,
    git_ref: &str,
    credential: Option<&str>,
    limits: FetchLimits,
    work_root: &Path,
) -> Result<Checkout, RepoError> {
    let dir = work_dir(work_root)?;
    let f = fetcher(&dir.0, limits);
    let commit = fetch_in(&f, url, git_ref, credential).await?;
    let tar = f.tar().await?;
    Ok(Checkout { tar, commit })
}

/// What a session that starts from an environment's snapshot (which
/// holds the checkout at `base`) needs on top of it: the files that
/// differ, and the list of every path of the new tree, so that the
/// sandbox removes what the new tree no longer has.
#[derive(Debug)]
pub struct Delta {
    pub commit: String,
    /// The added and changed files as a tar. Every tracked file when the
    /// base is not in the fetched history (`from_base` false); the whole
    /// checkout, `.git` included, when no base was given.
    pub tar: Vec<u8>,
    /// Every tracked path at `commit`, each ended by NUL.
    pub paths: Vec<u8>,
    /// Paths in `tar` (tracked files; 0 when no base was given).
    pub changed: u64,
    /// The base was found and `tar` holds only what differs from it.
    pub from_base: bool,
}

/// [`fetch`] under the same caps, answered as a [`Delta`] from `base` (a
/// full commit id), or as the whole checkout when `base` is `None` (an
/// environment's build). The fetched history is 50 commits deep: a ref
/// further ahead of the base, or not descended from it, gets every
/// tracked file, which is still correct, only larger.
pub async fn fetch_delta(
    url: &str,
    git_ref: &str,
    base: Option<&str>,
    credential: Option<&str>,
    limits: FetchLimits,
    work_root: &Path,
) -> Result<Delta, RepoError> {
    let dir = work_dir(work_root)?;
    let f = fetcher(&dir.0, limits);
    let commit = fetch_in(&f, url, git_ref, credential).await?;
    let paths = f
        .git_bytes("ls-files", &["ls-files", "-z", "--full-name"])
        .await?;
    let Some(base) = base else {
        let tar = f.tar().await?;
        return Ok(Delta {
            commit,
            tar,
            paths,
            changed: 0,
            from_base: false,
        });
    };
    let known = f
        .git(
            "cat-file",
            &["cat-file", "-t", &format!("{base}^{{commit}}")],
        )
        .await
        .is_ok();
    let list = if known {
        f.git_bytes(
            "diff",
            &[
                "diff",
                "--name-only",
                "--no-renames",
                "-z",
                "--diff-filter=d",
                base,
                "HEAD",
            ],
        )
        .await?
    } else {
        paths.clone()
    };
    let changed = list.split(|b| *b == 0).filter(|p| !p.is_empty()).count() as u64;
    // The list lives in .git, which is not packed here.
    let list_file = f.dir.join(".git/hatchery-delta-paths");
    std::fs::write(&list_file, &list)?;
    let list_arg = list_file.to_string_lossy().to_string();
    let tar = f
        .tar_of(&["--null", "--no-recursion", "-T", &list_arg])
        .await?;
    Ok(Delta {
        commit,
        tar,
        paths,
        changed,
        from_base: known,
    })
}

fn work_dir(work_root: &Path) -> Result<TempDir, RepoError> {
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(work_root)?;
    }
    let dir = TempDir(work_root.join(crate::ids::new_id("fetch")));
    std::fs::create_dir(&dir.0)?;
    Ok(dir)
}

fn fetcher(d: &Path, limits: FetchLimits) -> Fetcher<'_> {
    Fetcher {
        dir: d,
        limits,
        deadline: Instant::now() + limits.timeout,
        watch: Watch {
            dir: d.to_path_buf(),
            limits,
        },
    }
}

/// init, fetch (depth 50), tree check, checkout; the commit checked out.
async fn fetch_in(
    f: &Fetcher<'_>,
    url: &str,
    git_ref: &str,
    credential: Option<&str>,
) -> Result<String, RepoError> {
    let d = f.dir;
    f.git("init", &["init", "-q", "-b", "hatchery-session"])
        .await?;
    // Over git:// protocol v2 stalls twice per fetch on loopback and
    // LANs: its requests go out as several small writes, and the server,
    // with nothing to answer until the last one, delays its ACK (40 ms
    // on Linux) while Nagle holds the rest (measured: 100 ms a fetch
    // with v2, 19 ms with v1, against `git daemon`). Version 1 sends its
    // wants in one flush. HTTP(S) sends each request as one body and
    // keeps v2 (and its server-side ref filtering).
    let version = if url.starts_with("git://") {
        "protocol.version=1"
    } else {
        "protocol.version=2"
    };
    let args = [
        "-c",
        version,
        "-c",
        "protocol.file.allow=always",
        // Keep what arrives as one pack (never millions of loose
        // objects), so RLIMIT_FSIZE bounds it as one file.
        "-c",
        "fetch.unpackLimit=1",
        "-c",
        "transfer.unpackLimit=1",
        "fetch",
        "-q",
        "--no-tags",
        "--depth",
        "50",
        "--",
        url,
        git_ref,
    ];
    f.git_with("fetch", &args, credential).await?;
    f.check_tree("FETCH_HEAD").await?;
    f.git(
        "checkout",
        &["checkout", "-q", "-B", "hatchery-session", "FETCH_HEAD"],
    )
    .await?;
    let commit = f.git("rev-parse", &["rev-parse", "HEAD"]).await?;
    // FETCH_HEAD names the URL; the sandbox does not need it.
    let _ = std::fs::remove_file(d.join(".git/FETCH_HEAD"));
    f.watch.check().await?;
    Ok(commit)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(p: &Path, args: &[&str]) -> String {
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(p)
            .args(args)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@t")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@t")
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn repo_with(files: &[(&str, Vec<u8>)]) -> tempfile::TempDir {
        let src = tempfile::tempdir().unwrap();
        let p = src.path();
        run(p, &["init", "-q", "-b", "main"]);
        for (name, data) in files {
            std::fs::write(p.join(name), data).unwrap();
        }
        run(p, &["add", "."]);
        run(p, &["commit", "-q", "-m", "one"]);
        src
    }

    fn empty(root: &Path) -> bool {
        std::fs::read_dir(root)
            .map(|mut r| r.next().is_none())
            .unwrap_or(true)
    }

    #[tokio::test]
    async fn fetches_a_local_repo_and_refuses_a_missing_one() {
        let src = repo_with(&[("a.txt", b"hello".to_vec())]);
        let work = tempfile::tempdir().unwrap();
        let url = format!("file://{}", src.path().display());
        let l = FetchLimits::for_bytes(1 << 20, 1000);
        let c = fetch(&url, "main", None, l, work.path()).await.unwrap();
        assert_eq!(c.commit.len(), 40);
        assert!(c.tar.len() > 100);
        let tar_len = c.tar.len() as u64;
        // The tar cap at its boundary: exactly its size passes, one byte
        // less is refused.
        let at = FetchLimits {
            max_bytes: tar_len,
            ..l
        };
        assert!(fetch(&url, "main", None, at, work.path()).await.is_ok());
        let under = FetchLimits {
            max_bytes: tar_len - 1,
            ..l
        };
        let e = fetch(&url, "main", None, under, work.path())
            .await
            .err()
            .unwrap();
        assert!(matches!(e, RepoError::TooLarge { .. }), "{e}");
        assert!(matches!(
            fetch(&url, "nope", None, l, work.path()).await,
            Err(RepoError::Git { step: "fetch", .. })
        ));
        assert!(empty(work.path()), "a fetch left its directory behind");
    }

    /// The names in a tar, sorted.
    fn tar_names(tar: &[u8]) -> Vec<String> {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("t.tar");
        std::fs::write(&f, tar).unwrap();
        let out = std::process::Command::new("tar")
            .arg("-tf")
            .arg(&f)
            .output()
            .unwrap();
        let mut v: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| l.trim_start_matches("./").to_string())
            .filter(|l| !l.is_empty())
            .collect();
        v.sort();
        v
    }

    #[tokio::test]
    async fn a_delta_holds_only_what_changed_since_the_base() {
        let src = repo_with(&[
            ("keep.txt", b"same".to_vec()),
            ("edit.txt", b"old".to_vec()),
            ("drop.txt", b"bye".to_vec()),
        ]);
        let p = src.path();
        let work = tempfile::tempdir().unwrap();
        let url = format!("file://{}", p.display());
        let l = FetchLimits::for_bytes(1 << 20, 1000);
        // No base: the whole checkout, .git included, and every path.
        let full = fetch_delta(&url, "main", None, None, l, work.path())
            .await
            .unwrap();
        assert!(!full.from_base && full.changed == 0);
        assert!(tar_names(&full.tar).iter().any(|n| n.starts_with(".git/")));
        assert_eq!(full.paths, b"drop.txt\0edit.txt\0keep.txt\0");
        let base = full.commit.clone();

        std::fs::write(p.join("edit.txt"), b"new").unwrap();
        std::fs::create_dir(p.join("sub")).unwrap();
        std::fs::write(p.join("sub/add.txt"), b"added").unwrap();
        std::fs::remove_file(p.join("drop.txt")).unwrap();
        run(p, &["add", "-A", "."]);
        run(p, &["commit", "-q", "-m", "two"]);
        let d = fetch_delta(&url, "main", Some(&base), None, l, work.path())
            .await
            .unwrap();
        assert!(d.from_base);
        assert_eq!(d.changed, 2);
        assert_eq!(tar_names(&d.tar), ["edit.txt", "sub/add.txt"]);
        assert_eq!(d.paths, b"edit.txt\0keep.txt\0sub/add.txt\0");
        assert_ne!(d.commit, base);

        // A base the fetched history does not hold: every tracked file
        // (never .git), still correct.
        let unknown = "0123456789abcdef0123456789abcdef01234567";
        let u = fetch_delta(&url, "main", Some(unknown), None, l, work.path())
            .await
            .unwrap();
        assert!(!u.from_base);
        assert_eq!(tar_names(&u.tar), ["edit.txt", "keep.txt", "sub/add.txt"]);
        assert!(
            empty(work.path()),
            "a delta fetch left its directory behind"
        );
    }

    #[tokio::test]
    async fn a_huge_blob_stops_at_the_cap_on_disk() {
        // 8 MiB of incompressible bytes against a 1 MiB cap: the pack
        // (one file) cannot grow past the cap (RLIMIT_FSIZE).
        let mut big = vec![0u8; 8 << 20];
        let mut x: u64 = 0x9e3779b97f4a7c15;
        for b in big.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        let src = repo_with(&[("big.bin", big)]);
        let work = tempfile::tempdir().unwrap();
        let url = format!("file://{}", src.path().display());
        let l = FetchLimits::for_bytes(1 << 20, 1000);
        let e = fetch(&url, "main", None, l, work.path())
            .await
            .err()
            .unwrap();
        assert!(matches!(e, RepoError::TooLarge { .. }), "{e}");
        assert_eq!(e.cap(), Some("bytes"));
        assert!(empty(work.path()));
    }

    #[tokio::test]
    async fn a_git_bomb_is_refused_before_checkout() {
        // One blob, a tree of 10 entries naming it, and 5 levels of trees
        // of 10 naming the one below: 10^6 paths in a few hundred bytes.
        let src = tempfile::tempdir().unwrap();
        let p = src.path();
        run(p, &["init", "-q", "-b", "main"]);
        let mk = |input: String| -> String {
            let mut c = std::process::Command::new("git")
                .arg("-C")
                .arg(p)
                .args(["mktree"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            use std::io::Write;
            c.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
            let out = c.wait_with_output().unwrap();
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        };
        std::fs::write(p.join("x"), "boom").unwrap();
        let blob = run(p, &["hash-object", "-w", "x"]);
        let mut tree = mk((0..10)
            .map(|i| format!("100644 blob {blob}\tf{i}\n"))
            .collect());
        for _ in 0..5 {
            tree = mk((0..10)
                .map(|i| format!("040000 tree {tree}\td{i}\n"))
                .collect());
        }
        let commit = run(p, &["commit-tree", &tree, "-m", "bomb"]);
        run(p, &["update-ref", "refs/heads/main", &commit]);
        let work = tempfile::tempdir().unwrap();
        let url = format!("file://{}", p.display());
        let l = FetchLimits::for_bytes(1 << 20, 1000);
        let t0 = std::time::Instant::now();
        let e = fetch(&url, "main", None, l, work.path())
            .await
            .err()
            .unwrap();
        assert!(matches!(e, RepoError::TooManyFiles(1000)), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(10));
        assert!(empty(work.path()));
    }

    #[tokio::test]
    async fn the_path_cap_is_exact() {
        // max_files paths pass; one more is refused (before checkout).
        let files: Vec<(String, Vec<u8>)> =
            (0..20).map(|i| (format!("f{i}"), vec![b'a'])).collect();
        let refs: Vec<(&str, Vec<u8>)> =
            files.iter().map(|(n, d)| (n.as_str(), d.clone())).collect();
        let src = repo_with(&refs);
        let url = format!("file://{}", src.path().display());
        let work = tempfile::tempdir().unwrap();
        let l = FetchLimits::for_bytes(1 << 20, 20);
        assert!(fetch(&url, "main", None, l, work.path()).await.is_ok());
        let l = FetchLimits::for_bytes(1 << 20, 19);
        assert!(matches!(
            fetch(&url, "main", None, l, work.path()).await,
            Err(RepoError::TooManyFiles(19))
        ));
        assert!(empty(work.path()));
    }
}
