//! Fetching the repository on the host. The credential (an HTTP header
//! from the operator's file) is passed to this one `git fetch` on its
//! command line config only: it is never written to the checkout, and the
//! sandbox receives a plain tar of the work tree and `.git`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::process::Command;

#[derive(Debug, thiserror::Error)]
pub enum RepoError {
    #[error("git {step} failed: {stderr}")]
    Git { step: &'static str, stderr: String },
    #[error("repository checkout is over {0} bytes")]
    TooLarge(u64),
    #[error("fetch timed out after {0:?}")]
    Timeout(Duration),
    #[error("host: {0}")]
    Io(#[from] std::io::Error),
}

pub struct Checkout {
    pub tar: Vec<u8>,
    pub commit: String,
}

const FETCH_TIMEOUT: Duration = Duration::from_secs(120);

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn git(dir: &Path, step: &'static str, args: &[&str]) -> Result<String, RepoError> {
    let mut c = Command::new("git");
    c.arg("-C")
        .arg(dir)
        .args(args)
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
    let out = tokio::time::timeout(FETCH_TIMEOUT, c.output())
        .await
        .map_err(|_| RepoError::Timeout(FETCH_TIMEOUT))??;
    if !out.status.success() {
        let e = String::from_utf8_lossy(&out.stderr);
        return Err(RepoError::Git {
            step,
            stderr: crate::events::cut(e.trim(), 2000).to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Fetches `git_ref` of `url` (depth 50) and packs it as a tar.
pub async fn fetch(
    url: &str,
    git_ref: &str,
    credential: Option<&str>,
    max_bytes: u64,
) -> Result<Checkout, RepoError> {
    let dir = TempDir(std::env::temp_dir().join(crate::ids::new_id("hatchery-repo")));
    std::fs::create_dir_all(&dir.0)?;
    let d = dir.0.as_path();
    git(d, "init", &["init", "-q", "-b", "hatchery-session"]).await?;
    let header;
    let mut args: Vec<&str> = vec![];
    if let Some(c) = credential {
        header = format!("http.extraHeader={c}");
        args.extend(["-c", header.as_str()]);
    }
    args.extend([
        "-c",
        "protocol.file.allow=always",
        "fetch",
        "-q",
        "--no-tags",
        "--depth",
        "50",
        "--",
        url,
        git_ref,
    ]);
    git(d, "fetch", &args).await?;
    git(
        d,
        "checkout",
        &["checkout", "-q", "-B", "hatchery-session", "FETCH_HEAD"],
    )
    .await?;
    let commit = git(d, "rev-parse", &["rev-parse", "HEAD"]).await?;
    // FETCH_HEAD names the URL; the sandbox does not need it.
    let _ = std::fs::remove_file(d.join(".git/FETCH_HEAD"));
    let out = Command::new("tar")
        .arg("-C")
        .arg(d)
        .args(["-cf", "-", "."])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .output()
        .await?;
    if !out.status.success() {
        return Err(RepoError::Git {
            step: "tar",
            stderr: String::from_utf8_lossy(&out.stderr).to_string(),
        });
    }
    if out.stdout.len() as u64 > max_bytes {
        return Err(RepoError::TooLarge(max_bytes));
    }
    Ok(Checkout {
        tar: out.stdout,
        commit,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn fetches_a_local_repo_and_refuses_a_missing_one() {
        let src = tempfile::tempdir().unwrap();
        let p = src.path();
        let run = |args: &[&str]| {
            let ok = std::process::Command::new("git")
                .arg("-C")
                .arg(p)
                .args(args)
                .env("GIT_CONFIG_GLOBAL", "/dev/null")
                .status()
                .unwrap()
                .success();
            assert!(ok, "{args:?}");
        };
        run(&["init", "-q", "-b", "main"]);
        std::fs::write(p.join("a.txt"), "hello").unwrap();
        run(&["add", "."]);
        run(&[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-q",
            "-m",
            "one",
        ]);
        let url = format!("file://{}", p.display());
        let c = fetch(&url, "main", None, 1 << 20).await.unwrap();
        assert_eq!(c.commit.len(), 40);
        assert!(c.tar.len() > 100);
        assert!(matches!(
            fetch(&url, "main", None, 10).await,
            Err(RepoError::TooLarge(_))
        ));
        assert!(matches!(
            fetch(&url, "nope", None, 1 << 20).await,
            Err(RepoError::Git { step: "fetch", .. })
        ));
    }
}
