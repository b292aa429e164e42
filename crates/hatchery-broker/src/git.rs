//! `git_push` on the host: the sandbox's work tree arrives as a
//! fast-import stream (never unpacked on the host), becomes one commit on
//! top of the branch's remote tip (or the session's base commit), and is
//! pushed, fast-forward only, with the operator's write credential passed
//! to that one `git push` as `-c http.extraHeader`. The credential never
//! enters a sandbox and is never written to disk by the broker.

use std::path::Path;
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
}

const STEP_TIMEOUT: Duration = Duration::from_secs(120);

/// Where and how the broker pushes.
#[derive(Debug, Clone, Default)]
pub struct Remote {
    /// The URL pushed to (the session's repository, after rewrites).
    pub url: String,
    /// `Header: value` sent on http(s) remotes.
    pub header: Option<String>,
}

/// A working git directory of the host's own (config from nowhere else).
pub struct Scratch {
    dir: tempfile::TempDir,
}

fn cut(s: &str, n: usize) -> String {
    let s = s.trim();
    if s.len() <= n {
        return s.to_string();
    }
    let mut e = n;
    while !s.is_char_boundary(e) {
        e -= 1;
    }
    s[..e].to_string()
}

impl Scratch {
    pub async fn new() -> Result<Scratch, GitError> {
        let s = Scratch {
            dir: tempfile::Builder::new()
                .prefix("hatchery-push-")
                .tempdir()?,
        };
        s.git("init", &["init", "-q", "--bare", "."], None, None, &[])
            .await?;
        Ok(s)
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Runs git in the scratch repository; `header` goes on the command
    /// line config only. The child dies with the broker (a killed daemon
    /// leaves no push running behind its back).
    pub async fn git(
        &self,
        step: &'static str,
        args: &[&str],
        header: Option<&str>,
        stdin: Option<&[u8]>,
        env: &[(&str, &str)],
    ) -> Result<String, GitError> {
        let mut c = Command::new("git");
        c.arg("-C").arg(self.dir.path());
        if let Some(h) = header {
            c.arg("-c").arg(format!("http.extraHeader={h}"));
        }
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
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches
        // only the calling (child) process.
        unsafe {
            c.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
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
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }
}

/// The commit `refs/heads/<branch>` is at on the remote, if it exists.
pub async fn remote_tip(remote: &Remote, branch: &str) -> Result<Option<String>, GitError> {
    let s = Scratch::new().await?;
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

/// The commit to push: the work tree (`tree_stream`, from
/// `sandbox/export_tree.py`) on top of `parent`, fetched from the remote
/// (`parent_ref`), with the author, committer, date and message the host
/// chooses.
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

pub async fn prepare(
    remote: &Remote,
    parent_ref: &str,
    expect_parent: Option<&str>,
    tree_stream: &[u8],
    info: &CommitInfo<'_>,
) -> Result<Prepared, GitError> {
    let s = Scratch::new().await?;
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
    let mut stream = Vec::with_capacity(tree_stream.len() + 512);
    let when = format!("{} +0000", info.date);
    stream.extend_from_slice(b"commit refs/hatchery/push\n");
    stream.extend_from_slice(format!("author {} <{}> {when}\n", info.name, info.email).as_bytes());
    stream
        .extend_from_slice(format!("committer {} <{}> {when}\n", info.name, info.email).as_bytes());
    stream.extend_from_slice(format!("data {}\n{}\n", info.message.len(), info.message).as_bytes());
    stream.extend_from_slice(format!("from {parent}\n").as_bytes());
    stream.extend_from_slice(tree_stream);
    stream.extend_from_slice(b"\ndone\n");
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
    let first_parent = s
        .git(
            "rev-parse",
            &["rev-parse", "--verify", "refs/hatchery/push^1"],
            None,
            None,
            &[],
        )
        .await?;
    if first_parent != parent {
        return Err(GitError::Invalid(
            "the work tree stream changed the commit's parent".into(),
        ));
    }
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

    /// A real push into a file:// bare repository: the commit lands, is a
    /// fast-forward of the base, carries the stream's tree, and the tip
    /// check sees it.
    #[tokio::test]
    async fn prepare_push_and_tip() {
        let d = tempfile::tempdir().unwrap();
        sh(d.path(), "git init -q --bare -b main remote.git && git init -q -b main w && cd w && echo a > a && git add a && git commit -qm base && git push -q ../remote.git main");
        let remote = Remote {
            url: format!("file://{}/remote.git", d.path().display()),
            header: None,
        };
        let base = remote_tip(&remote, "main").await.unwrap().unwrap();
        assert_eq!(remote_tip(&remote, "hatchery/s").await.unwrap(), None);
        let stream = b"deleteall\nM 100644 inline \"b.txt\"\ndata 3\nhi\n\n";
        let info = CommitInfo {
            message: "m",
            name: "n",
            email: "e@x",
            date: 1_700_000_000,
        };
        let p = prepare(&remote, "refs/heads/main", Some(&base), stream, &info)
            .await
            .unwrap();
        assert_eq!(p.parent, base);
        push(&p, &remote, "hatchery/s").await.unwrap();
        assert_eq!(
            remote_tip(&remote, "hatchery/s").await.unwrap().as_deref(),
            Some(p.commit.as_str())
        );
        // A stale parent is refused before anything is pushed.
        let e = prepare(&remote, "refs/heads/main", Some("0000"), stream, &info).await;
        assert!(matches!(e, Err(GitError::Invalid(_))));
    }
}
