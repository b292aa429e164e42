//! `git_push` on the host: the sandbox's work tree arrives as file and
//! delete records (`tree.rs`; never unpacked on the host), from which the
//! host writes a fast-import stream of its own: one commit with the host's
//! author, committer, date and message and exactly one parent, the
//! branch's remote tip (or the session's base commit). It is pushed,
//! fast-forward only, with the operator's write credential passed to that
//! one `git push` as `http.extraHeader` through git's environment config
//! (`GIT_CONFIG_COUNT`/`KEY_0`/`VALUE_0`), never its argv: another user on
//! the host can read any process's command line, not its environment. The
//! credential never enters a sandbox and is never written to disk by the
//! broker.

use crate::tree::{Change, TreeChanges};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

#[derive(Debug, thiserror::Error)]
pub enum GitError {
    #[error("git {step} failed: {stderr}")]
    Git { step: &'static str, stderr: String },
    #[error("git {0} timed out")]
    Timeout(&'static str),
    #[error("host: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Invalid(String),
    /// The commit fast-import made is not the one the host wrote (a
    /// defect of the host's stream; never pushed).
    #[error("the prepared commit is not the host's: {0}")]
    NotHostCommit(String),
}

const STEP_TIMEOUT: Duration = Duration::from_secs(120);

/// Where and how the broker pushes.
#[derive(Debug, Clone, Default)]
pub struct Remote {
    /// The URL pushed to (the session's repository, after rewrites).
    pub url: String,
    /// `Header: value` sent on http(s) remotes.
    pub header: Option<String>,
    /// Where this host's scratch repositories for the remote are made
    /// ([`scratch_root`]).
    pub scratch: PathBuf,
}

/// The directory a broker makes its scratch repositories in:
/// `DATA_DIR/broker-scratch/<pid>-XXXX`, not `/tmp`. A push cut short by a
/// SIGKILL cannot remove its own scratch repository, so each broker, when
/// it starts, removes what earlier processes left there (any entry not
/// named for this process; two brokers in one process keep their own).
pub fn scratch_root(data: &Path) -> std::io::Result<PathBuf> {
    let parent = data.join("broker-scratch");
    std::fs::create_dir_all(&parent)?;
    let mine = format!("{}-", std::process::id());
    for e in std::fs::read_dir(&parent)? {
        let e = e?;
        if !e.file_name().to_string_lossy().starts_with(&mine) {
            let gone = std::fs::remove_dir_all(e.path());
            if let Err(err) = gone {
                tracing::warn!(path = %e.path().display(), error = %err, "could not remove a scratch repository left by an earlier process");
            }
        }
    }
    Ok(tempfile::Builder::new()
        .prefix(&mine)
        .tempdir_in(&parent)?
        .keep())
}

/// A working git directory of the host's own (config from nowhere else).
pub struct Scratch {
    dir: tempfile::TempDir,
}

/// git's output, trimmed, cut to at most `n` bytes (crate::cut's rule).
fn cut(s: &str, n: usize) -> String {
    crate::cut::cut(s.trim(), n)
}

impl Scratch {
    /// A bare repository in a new directory under `root` (removed on drop).
    pub async fn new(root: &Path) -> Result<Scratch, GitError> {
        let s = Scratch {
            dir: tempfile::Builder::new().prefix("push-").tempdir_in(root)?,
        };
        s.git("init", &["init", "-q", "--bare", "."], None, None, &[])
            .await?;
        Ok(s)
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Runs git in the scratch repository ([`Scratch::command`]).
    pub async fn git(
        &self,
        step: &'static str,
        args: &[&str],
        header: Option<&str>,
        stdin: Option<&[u8]>,
        env: &[(&str, &str)],
    ) -> Result<String, GitError> {
        let out = self.git_raw(step, args, header, stdin, env).await?;
        Ok(String::from_utf8_lossy(&out).trim().to_string())
    }

    /// [`Scratch::git`]'s stdout as bytes, untrimmed.
    pub async fn git_raw(
        &self,
        step: &'static str,
        args: &[&str],
        header: Option<&str>,
        stdin: Option<&[u8]>,
        env: &[(&str, &str)],
    ) -> Result<Vec<u8>, GitError> {
        let mut c = self.command(args, header, env);
        c.stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
        let mut child = c.spawn()?;
        if let (Some(data), Some(mut w)) = (stdin, child.stdin.take()) {
            let data = data.to_vec();
            tokio::spawn(async move {
                let _ = w.write_all(&data).await;
                let _ = w.shutdown().await;
            });
        }
        let out = tokio::time::timeout(STEP_TIMEOUT, child.wait_with_output())
            .await
            .map_err(|_| GitError::Timeout(step))??;
        if !out.status.success() {
            let e = String::from_utf8_lossy(&out.stderr);
            return Err(GitError::Git {
                step,
                stderr: cut(&e, 2000),
            });
        }
        Ok(out.stdout)
    }

    /// git in the scratch repository with the host's environment only
    /// (no user or system config, no prompt), stdout and stderr piped,
    /// stdin closed; the child dies with the broker (a killed daemon
    /// leaves no push running behind its back). `header` goes into git's
    /// environment config, never its command line.
    pub(crate) fn command(
        &self,
        args: &[&str],
        header: Option<&str>,
        env: &[(&str, &str)],
    ) -> Command {
        let mut c = Command::new("git");
        c.arg("-C").arg(self.dir.path());
        c.args(args)
            .env_clear()
            .env(
                "PATH",
                std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()),
            )
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_ALLOW_PROTOCOL", "https:http:git:file")
            .env("HOME", self.dir.path())
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        // After env_clear, which would drop it.
        if let Some(h) = header {
            c.env("GIT_CONFIG_COUNT", "1")
                .env("GIT_CONFIG_KEY_0", "http.extraHeader")
                .env("GIT_CONFIG_VALUE_0", h);
        }
        // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches
        // only the calling (child) process.
        unsafe {
            c.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        c
    }
}

/// The commit `refs/heads/<branch>` is at on the remote, if it exists.
pub async fn remote_tip(remote: &Remote, branch: &str) -> Result<Option<String>, GitError> {
    let s = Scratch::new(&remote.scratch).await?;
    let r = format!("refs/heads/{branch}");
    let out = s
        .git(
            "ls-remote",
            &["ls-remote", "--", &remote.url, &r],
            remote.header.as_deref(),
            None,
            &[],
        )
        .await?;
    Ok(out.lines().find_map(|l| {
        l.split_once('\t')
            .filter(|(_, n)| *n == r)
            .map(|(h, _)| h.to_string())
    }))
}

/// The commit to push: the work tree's changes (parsed by
/// `tree::parse` from what `sandbox/export_tree.py` wrote) on top of
/// `parent`, fetched from the remote (`parent_ref`), with the author,
/// committer, date and message the host chooses.
pub struct Prepared {
    pub scratch: Scratch,
    pub commit: String,
    pub parent: String,
}

pub struct CommitInfo<'a> {
    pub message: &'a str,
    pub name: &'a str,
    pub email: &'a str,
    /// Unix seconds.
    pub date: i64,
}

/// A path in fast-import's C-style quoting: everything but printable
/// ASCII as an octal escape, so no byte of a path can end the command
/// line or start another one.
fn quote_path(p: &[u8], out: &mut Vec<u8>) {
    out.push(b'"');
    for &c in p {
        match c {
            b'"' | b'\\' => {
                out.push(b'\\');
                out.push(c);
            }
            0x20..=0x7e => out.push(c),
            _ => out.extend_from_slice(format!("\\{c:03o}").as_bytes()),
        }
    }
    out.push(b'"');
}

/// An identity fast-import takes as it is: no `<`, `>` or newline, which
/// would end the name or the line.
fn check_ident(what: &str, v: &str) -> Result<(), GitError> {
    if v.is_empty() || v.contains(['<', '>', '\n', '\0']) {
        return Err(GitError::Invalid(format!("bad commit {what} {v:?}")));
    }
    Ok(())
}

/// The whole fast-import stream, written by the host: its commit header,
/// then the guest's changes, each path quoted here and each content sent
/// with its exact length.
fn fast_import_stream(tree: &TreeChanges<'_>, info: &CommitInfo<'_>, parent: &str) -> Vec<u8> {
    let mut s = Vec::with_capacity(tree.data_bytes as usize + 64 * tree.changes.len() + 512);
    let ident = format!("{} <{}> {} +0000", info.name, info.email, info.date);
    s.extend_from_slice(b"commit refs/hatchery/push\n");
    s.extend_from_slice(format!("author {ident}\ncommitter {ident}\n").as_bytes());
    s.extend_from_slice(format!("data {}\n", info.message.len()).as_bytes());
    s.extend_from_slice(info.message.as_bytes());
    s.extend_from_slice(format!("\nfrom {parent}\n").as_bytes());
    if tree.replace {
        s.extend_from_slice(b"deleteall\n");
    }
    for c in &tree.changes {
        match c {
            Change::File { mode, path, data } => {
                s.extend_from_slice(format!("M {} inline ", mode.as_str()).as_bytes());
                quote_path(path, &mut s);
                s.extend_from_slice(format!("\ndata {}\n", data.len()).as_bytes());
                s.extend_from_slice(data);
                s.push(b'\n');
            }
            Change::Delete { path } => {
                s.extend_from_slice(b"D ");
                quote_path(path, &mut s);
                s.push(b'\n');
            }
        }
    }
    s.extend_from_slice(b"done\n");
    s
}

/// Reads the commit back and compares it with what the host wrote, byte
/// for byte: one tree, exactly one parent (`parent`), the host's author
/// and committer, the host's message. Whatever made it otherwise, it is
/// not pushed.
async fn verify_commit(
    s: &Scratch,
    commit: &str,
    parent: &str,
    info: &CommitInfo<'_>,
) -> Result<(), GitError> {
    let raw = s
        .git_raw("cat-file", &["cat-file", "commit", commit], None, None, &[])
        .await?;
    let ident = format!("{} <{}> {} +0000", info.name, info.email, info.date);
    let sep = raw
        .windows(2)
        .position(|w| w == b"\n\n")
        .ok_or_else(|| GitError::NotHostCommit("no message".into()))?;
    let (head, body) = (&raw[..sep], &raw[sep + 2..]);
    let lines: Vec<&[u8]> = head.split(|&c| c == b'\n').collect();
    let want_rest = [
        format!("parent {parent}"),
        format!("author {ident}"),
        format!("committer {ident}"),
    ];
    let tree_ok = lines.first().is_some_and(|l| {
        l.strip_prefix(b"tree ")
            .is_some_and(|h| !h.is_empty() && h.iter().all(u8::is_ascii_hexdigit))
    });
    if !tree_ok
        || lines.len() != 4
        || lines[1..]
            .iter()
            .zip(&want_rest)
            .any(|(l, w)| *l != w.as_bytes())
    {
        return Err(GitError::NotHostCommit(cut(
            &String::from_utf8_lossy(head),
            1000,
        )));
    }
    if body != info.message.as_bytes() {
        return Err(GitError::NotHostCommit("another message".into()));
    }
    Ok(())
}

pub async fn prepare(
    remote: &Remote,
    parent_ref: &str,
    expect_parent: Option<&str>,
    tree: &TreeChanges<'_>,
    info: &CommitInfo<'_>,
) -> Result<Prepared, GitError> {
    check_ident("author name", info.name)?;
    check_ident("author email", info.email)?;
    let s = Scratch::new(&remote.scratch).await?;
    s.git(
        "fetch",
        &["fetch", "-q", "--depth", "1", "--", &remote.url, parent_ref],
        remote.header.as_deref(),
        None,
        &[],
    )
    .await?;
    let parent = s
        .git(
            "rev-parse",
            &["rev-parse", "--verify", "FETCH_HEAD^{commit}"],
            None,
            None,
            &[],
        )
        .await?;
    if let Some(p) = expect_parent {
        if p != parent {
            return Err(GitError::Invalid(format!(
                "{parent_ref} is at {parent} on the remote, not at the session's base {p}"
            )));
        }
    }
    let stream = fast_import_stream(tree, info, &parent);
    s.git(
        "fast-import",
        &["fast-import", "--quiet", "--done", "--force"],
        None,
        Some(&stream),
        &[],
    )
    .await?;
    let commit = s
        .git(
            "rev-parse",
            &["rev-parse", "--verify", "refs/hatchery/push^{commit}"],
            None,
            None,
            &[],
        )
        .await?;
    verify_commit(&s, &commit, &parent, info).await?;
    Ok(Prepared {
        scratch: s,
        commit,
        parent,
    })
}

/// Pushes `commit` to `refs/heads/<branch>`, fast-forward only.
pub async fn push(p: &Prepared, remote: &Remote, branch: &str) -> Result<String, GitError> {
    let spec = format!("{}:refs/heads/{branch}", p.commit);
    p.scratch
        .git(
            "push",
            &["push", "--porcelain", "--", &remote.url, &spec],
            remote.header.as_deref(),
            None,
            &[],
        )
        .await
}

/// Branch names the broker accepts (`git check-ref-format`'s rules, a
/// little stricter: no leading `-`, printable ASCII).
pub fn valid_branch(b: &str) -> bool {
    !b.is_empty()
        && b.len() <= 200
        && !b.starts_with('-')
        && !b.starts_with('/')
        && !b.ends_with('/')
        && !b.ends_with('.')
        && !b.ends_with(".lock")
        && !b.contains("..")
        && !b.contains("//")
        && !b.contains("@{")
        && b.bytes()
            .all(|c| c.is_ascii_graphic() && !b"~^:?*[\\".contains(&c))
        && b.split('/').all(|c| !c.is_empty() && !c.starts_with('.'))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::tree::tests::stream;

    #[test]
    fn branches() {
        for ok in ["hatchery/ses_1", "main", "feature/x-1"] {
            assert!(valid_branch(ok), "{ok}");
        }
        for bad in [
            "", "-x", "a..b", "a b", "a:b", "a/", "/a", ".a", "a/.b", "x.lock", "a@{1}", "a\\b",
            "a~1",
        ] {
            assert!(!valid_branch(bad), "{bad}");
        }
    }

    /// What a SIGKILLed push left under the data dir is gone when the next
    /// broker starts; a second broker of the same process keeps its own.
    #[tokio::test]
    async fn scratch_root_removes_what_earlier_processes_left() {
        let d = tempfile::tempdir().unwrap();
        let left = d.path().join("broker-scratch/999999999-old/push-x");
        std::fs::create_dir_all(&left).unwrap();
        let a = scratch_root(d.path()).unwrap();
        assert!(!left.exists());
        assert!(a.starts_with(d.path().join("broker-scratch")));
        let s = Scratch::new(&a).await.unwrap();
        let b = scratch_root(d.path()).unwrap();
        assert_ne!(a, b);
        assert!(
            s.path().exists(),
            "another broker's scratch of this process is kept"
        );
        let p = s.path().to_path_buf();
        drop(s);
        assert!(!p.exists());
    }

    /// The write credential is in git's environment config, never in its
    /// argv (which any user on the host can read in `ps`).
    #[tokio::test]
    async fn the_credential_is_not_on_the_command_line() {
        let s = Scratch::new(&std::env::temp_dir()).await.unwrap();
        let secret = "Authorization: Bearer s3cret-token";
        let c = s.command(&["push", "origin"], Some(secret), &[]);
        let c = c.as_std();
        assert!(c
            .get_args()
            .all(|a| !a.to_string_lossy().contains("s3cret")));
        let env: Vec<_> = c.get_envs().collect();
        let val = |k: &str| {
            env.iter()
                .find(|(n, _)| *n == k)
                .and_then(|(_, v)| v.map(|v| v.to_string_lossy().into_owned()))
        };
        assert_eq!(val("GIT_CONFIG_COUNT").as_deref(), Some("1"));
        assert_eq!(val("GIT_CONFIG_KEY_0").as_deref(), Some("http.extraHeader"));
        assert_eq!(val("GIT_CONFIG_VALUE_0").as_deref(), Some(secret));
        let none = s.command(&["fetch"], None, &[]);
        assert!(none
            .as_std()
            .get_envs()
            .all(|(k, _)| k != "GIT_CONFIG_COUNT"));
    }

    /// Runs `cmd` in `dir` with a neutral git identity and no user config
    /// (the broker's service tests use it too).
    pub(crate) fn sh(dir: &Path, cmd: &str) {
        let st = std::process::Command::new("sh")
            .arg("-c")
            .arg(cmd)
            .current_dir(dir)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@x")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@x")
            .status()
            .unwrap();
        assert!(st.success(), "{cmd}");
    }

    fn out(dir: &Path, args: &[&str]) -> Vec<u8> {
        let o = std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .output()
            .unwrap();
        assert!(o.status.success(), "git {args:?}: {:?}", o);
        o.stdout
    }

    /// A bare remote with `main` at a base commit (files `a` and `dir/b`).
    fn remote_with_base(d: &Path) -> (Remote, String) {
        sh(d, "git init -q --bare -b main remote.git && git init -q -b main w && cd w && echo a > a && mkdir dir && echo b > dir/b && git add a dir && git commit -qm base && git push -q ../remote.git main");
        let remote = Remote {
            url: format!("file://{}/remote.git", d.display()),
            header: None,
            scratch: d.to_path_buf(),
        };
        let base = String::from_utf8(out(&d.join("remote.git"), &["rev-parse", "main"]))
            .unwrap()
            .trim()
            .to_string();
        (remote, base)
    }

    /// A scratch repository holding the remote's `main`, for tests that
    /// run fast-import there by hand.
    async fn scratch_with_main(remote: &Remote) -> Scratch {
        let s = Scratch::new(&std::env::temp_dir()).await.unwrap();
        s.git(
            "fetch",
            &["fetch", "-q", "--", &remote.url, "refs/heads/main"],
            None,
            None,
            &[],
        )
        .await
        .unwrap();
        s
    }

    const INFO: CommitInfo<'static> = CommitInfo {
        message: "Fix add()\n\nfrom the session",
        name: "Hatchery session",
        email: "session@hatchery.invalid",
        date: 1_700_000_000,
    };

    /// The whole way a guest's bytes go on the host: parsed, committed,
    /// pushed to `branch`.
    async fn push_stream(remote: &Remote, base: &str, raw: &[u8]) -> Result<String, String> {
        let t = crate::tree::parse(raw, 1 << 20).map_err(|e| e.to_string())?;
        let p = prepare(remote, "refs/heads/main", Some(base), &t, &INFO)
            .await
            .map_err(|e| e.to_string())?;
        push(&p, remote, "hatchery/s")
            .await
            .map_err(|e| e.to_string())?;
        Ok(p.commit)
    }

    /// A real push into a file:// bare repository: the commit lands, is a
    /// fast-forward of the base, carries the stream's tree, and the tip
    /// check sees it.
    #[tokio::test]
    async fn prepare_push_and_tip() {
        let d = tempfile::tempdir().unwrap();
        let (remote, base) = remote_with_base(d.path());
        assert_eq!(
            remote_tip(&remote, "main").await.unwrap().as_deref(),
            Some(base.as_str())
        );
        assert_eq!(remote_tip(&remote, "hatchery/s").await.unwrap(), None);
        let raw = stream(&[("100644", b"b.txt", b"hi\n")]);
        let t = crate::tree::parse(&raw, 1 << 20).unwrap();
        let p = prepare(&remote, "refs/heads/main", Some(&base), &t, &INFO)
            .await
            .unwrap();
        assert_eq!(p.parent, base);
        push(&p, &remote, "hatchery/s").await.unwrap();
        assert_eq!(
            remote_tip(&remote, "hatchery/s").await.unwrap().as_deref(),
            Some(p.commit.as_str())
        );
        // A stale parent is refused before anything is pushed.
        let e = prepare(&remote, "refs/heads/main", Some("0000"), &t, &INFO).await;
        assert!(matches!(e, Err(GitError::Invalid(_))));
    }

    /// What lands on the remote is the host's commit, byte for byte: one
    /// parent (the base), the host's author, committer, date and message,
    /// whatever the guest put in paths and contents (here: fast-import
    /// commands as a file's content, and a path made of quotes, a
    /// newline, a backslash, a byte that is not UTF-8 and a fake `M`
    /// command). Deletes and modes apply to the base's tree.
    #[tokio::test]
    async fn the_host_writes_the_commit() {
        let d = tempfile::tempdir().unwrap();
        let (remote, base) = remote_with_base(d.path());
        let bare = d.path().join("remote.git");
        let evil: &[u8] = b"commit refs/hatchery/push\nauthor Evil <e@x> 0 +0000\nmerge :1\n";
        let odd: &[u8] = b"q\"uo\\te\n\xffM 100644 inline x";
        let mut raw = crate::tree::HEADER.to_vec();
        for (m, p, data) in [
            ("100644", &b"notes.txt"[..], evil),
            ("100644", odd, &b"odd"[..]),
            ("100755", b"dir/run.sh", b"#!/bin/sh\n"),
            ("120000", b"link", b"dir/run.sh"),
        ] {
            raw.extend_from_slice(format!("file {m} {} {}\n", p.len(), data.len()).as_bytes());
            raw.extend_from_slice(p);
            raw.extend_from_slice(data);
            raw.push(b'\n');
        }
        raw.extend_from_slice(b"delete 5\ndir/b\nend\n");
        let commit = push_stream(&remote, &base, &raw).await.unwrap();
        let c = out(&bare, &["cat-file", "commit", &commit]);
        let tree =
            String::from_utf8(out(&bare, &["rev-parse", &format!("{commit}^{{tree}}")])).unwrap();
        let want = format!(
            "tree {}\nparent {base}\nauthor Hatchery session <session@hatchery.invalid> 1700000000 +0000\n\
             committer Hatchery session <session@hatchery.invalid> 1700000000 +0000\n\n{}",
            tree.trim(),
            INFO.message
        );
        assert_eq!(String::from_utf8_lossy(&c), want);
        let ls = out(&bare, &["ls-tree", "-r", "-z", "--full-tree", &commit]);
        let mut entries: Vec<(String, Vec<u8>)> = ls
            .split(|&b| b == 0)
            .filter(|e| !e.is_empty())
            .map(|e| {
                let tab = e.iter().position(|&b| b == b'\t').unwrap();
                let mode = String::from_utf8_lossy(&e[..6]).into_owned();
                (mode, e[tab + 1..].to_vec())
            })
            .collect();
        entries.sort();
        let mut want: Vec<(String, Vec<u8>)> = vec![
            ("100644".into(), b"a".to_vec()),
            ("100644".into(), b"notes.txt".to_vec()),
            ("100644".into(), odd.to_vec()),
            ("100755".into(), b"dir/run.sh".to_vec()),
            ("120000".into(), b"link".to_vec()),
        ];
        want.sort();
        assert_eq!(entries, want);
        assert_eq!(
            out(&bare, &["cat-file", "blob", &format!("{commit}:notes.txt")]),
            evil
        );
        assert_eq!(
            out(&bare, &["cat-file", "blob", &format!("{commit}:link")]),
            b"dir/run.sh"
        );
    }

    /// The injection of issue 31. First, that it is real: behind a host
    /// header (as the broker used to send it) real git makes the guest's
    /// own commit, by "Evil", merging unrelated history, with the base as
    /// first parent, so the old first-parent check passed. Then: neither
    /// that stream nor its commands after valid records get past the
    /// parser, and the remote gets nothing.
    #[tokio::test]
    async fn the_guest_cannot_open_its_own_commit() {
        let d = tempfile::tempdir().unwrap();
        let (remote, base) = remote_with_base(d.path());
        // The guest knows the base: it is in its checkout.
        let prefix: &[u8] = b"deleteall\nM 100644 inline \"a\"\ndata 2\nx\n\n";
        let injection = format!(
            "commit refs/hatchery/unrelated\ncommitter Evil <evil@x> 1 +0000\ndata 1\nu\n\
             M 100644 inline \"planted\"\ndata 2\np\n\n\
             commit refs/hatchery/push\nauthor Evil <evil@x> 2 +0000\ncommitter Evil <evil@x> 2 +0000\n\
             data 5\nowned\nfrom {base}\nmerge refs/hatchery/unrelated\n"
        );
        let guest = [prefix, injection.as_bytes()].concat();
        let s = scratch_with_main(&remote).await;
        let mut old = format!(
            "commit refs/hatchery/push\ncommitter H <h@x> 0 +0000\ndata 1\nm\nfrom {base}\n"
        )
        .into_bytes();
        old.extend_from_slice(&guest);
        old.extend_from_slice(b"\ndone\n");
        s.git(
            "fast-import",
            &["fast-import", "--quiet", "--done", "--force"],
            None,
            Some(&old),
            &[],
        )
        .await
        .unwrap();
        let made = s
            .git(
                "log",
                &["log", "-1", "--format=%an %P", "refs/hatchery/push"],
                None,
                None,
                &[],
            )
            .await
            .unwrap();
        let first_parent = s
            .git(
                "rev-parse",
                &["rev-parse", "refs/hatchery/push^1"],
                None,
                None,
                &[],
            )
            .await
            .unwrap();
        assert!(
            made.starts_with("Evil ") && made.split(' ').count() == 3,
            "{made}"
        );
        assert_eq!(first_parent, base, "the old check would have passed");
        // What holds now.
        let e = push_stream(&remote, &base, &guest).await.unwrap_err();
        assert!(e.contains("not a tree stream"), "{e}");
        let mut framed = stream(&[("100644", b"a", b"x\n")]);
        framed.truncate(framed.len() - b"end\n".len());
        framed.extend_from_slice(injection.as_bytes());
        framed.extend_from_slice(b"end\n");
        let e = push_stream(&remote, &base, &framed).await.unwrap_err();
        assert!(
            e.contains("`commit` at byte") && e.contains("host writes the commit"),
            "{e}"
        );
        assert_eq!(remote_tip(&remote, "hatchery/s").await.unwrap(), None);
    }

    /// Malformed streams end at the parser with an error naming the
    /// problem, and the remote is left as it was.
    #[tokio::test]
    async fn malformed_streams_push_nothing() {
        let d = tempfile::tempdir().unwrap();
        let (remote, base) = remote_with_base(d.path());
        let ok = stream(&[("100644", b"a.txt", b"hello")]);
        let mut cases: Vec<(Vec<u8>, &str)> = vec![
            (ok[..ok.len() - 3].to_vec(), "ends early"),
            (ok[..ok.len() - 12].to_vec(), "ends early"),
            (
                b"hatchery-tree 1\nfile 100644 5 3\na.txthello\nend\n".to_vec(),
                "not followed by a newline",
            ),
            (
                b"hatchery-tree 1\nfile 100644 5 99\na.txthello\nend\n".to_vec(),
                "ends early",
            ),
            (
                b"hatchery-tree 1\nfile 100644 05 5\na.txthello\nend\n".to_vec(),
                "bad path length",
            ),
            (stream(&[("100644", b"../escape", b"x")]), "`..`"),
            (stream(&[("100644", b"/etc/passwd", b"x")]), "absolute"),
            (
                stream(&[("100755", b".git/hooks/post-checkout", b"x")]),
                ".git",
            ),
            (stream(&[("160000", b"sub", b"x")]), "only 100644"),
            (
                stream(&[("100644", b"big", &vec![b'x'; (1 << 20) + 1])]),
                "over",
            ),
        ];
        let mut trailing = ok.clone();
        trailing.extend_from_slice(b"reset refs/heads/main\n");
        cases.push((trailing, "after `end`"));
        for (raw, why) in cases {
            let e = push_stream(&remote, &base, &raw).await.unwrap_err();
            assert!(e.contains(why), "{why}: {e}");
        }
        assert_eq!(remote_tip(&remote, "hatchery/s").await.unwrap(), None);
        assert_eq!(
            String::from_utf8(out(
                &d.path().join("remote.git"),
                &["for-each-ref", "--format=%(refname)"]
            ))
            .unwrap(),
            "refs/heads/main\n"
        );
    }

    /// The check after fast-import catches a commit that is not the
    /// host's (a merge, another author), whatever made it.
    #[tokio::test]
    async fn a_foreign_commit_is_not_prepared() {
        let d = tempfile::tempdir().unwrap();
        let (remote, base) = remote_with_base(d.path());
        let s = scratch_with_main(&remote).await;
        let raw = stream(&[("100644", b"x", b"y")]);
        let t = crate::tree::parse(&raw, 100).unwrap();
        let good = fast_import_stream(&t, &INFO, &base);
        s.git(
            "fast-import",
            &["fast-import", "--quiet", "--done"],
            None,
            Some(&good),
            &[],
        )
        .await
        .unwrap();
        let c = s
            .git(
                "rev-parse",
                &["rev-parse", "refs/hatchery/push"],
                None,
                None,
                &[],
            )
            .await
            .unwrap();
        verify_commit(&s, &c, &base, &INFO).await.unwrap();
        let mut other = INFO.message.to_string();
        other.push('!');
        let changed = CommitInfo {
            message: &other,
            ..INFO
        };
        assert!(matches!(
            verify_commit(&s, &c, &base, &changed).await,
            Err(GitError::NotHostCommit(_))
        ));
        let merge = format!(
            "commit refs/hatchery/merge\nauthor Hatchery session <session@hatchery.invalid> 1700000000 +0000\n\
             committer Hatchery session <session@hatchery.invalid> 1700000000 +0000\ndata {}\n{}\n\
             from {base}\nmerge {c}\ndone\n",
            INFO.message.len(),
            INFO.message
        );
        s.git(
            "fast-import",
            &["fast-import", "--quiet", "--done"],
            None,
            Some(merge.as_bytes()),
            &[],
        )
        .await
        .unwrap();
        let m = s
            .git(
                "rev-parse",
                &["rev-parse", "refs/hatchery/merge"],
                None,
                None,
                &[],
            )
            .await
            .unwrap();
        let e = verify_commit(&s, &m, &base, &INFO).await.unwrap_err();
        assert!(matches!(e, GitError::NotHostCommit(_)), "{e}");
        // Identities that would break fast-import's lines are refused.
        let bad = CommitInfo {
            name: "x> 0 +0000\nmerge",
            ..INFO
        };
        assert!(matches!(
            prepare(&remote, "refs/heads/main", Some(&base), &t, &bad).await,
            Err(GitError::Invalid(_))
        ));
    }
}
