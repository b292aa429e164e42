//! The size of a push, measured on the host (issue 36): `git diff
//! --numstat -M` between the parent of the commit the broker is about to
//! push (the branch's remote tip, or the session's base commit) and that
//! commit, in the push's scratch repository. This, never a number the
//! agent sends, is what the policy's `diff.*` fields match.
//!
//! Bounded: one deadline for the whole run, a cap on one output line and
//! on the number of files; the output is counted as it is read, never
//! held whole (a tree of 100 000 files is a few MiB of numstat).

use crate::git::{GitError, Scratch};
use serde_json::{json, Value};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

/// How long one measurement may take.
pub const DIFF_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest numstat line taken: two counts and a quoted path (a path is at
/// most 4096 bytes, each byte at most 4 when quoted, twice for a rename).
pub const MAX_LINE_BYTES: usize = 64 << 10;
/// Most files one push may touch and still be measured (the tree stream
/// has at most 100 000 records, but replacing a large base deletes all of
/// its files).
pub const MAX_FILES: u64 = 1_000_000;

/// What a push changes: files touched (a binary file counts as a file
/// with no lines; a rename is one file), lines added and removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiffSize {
    pub files: u64,
    pub lines_added: u64,
    pub lines_removed: u64,
}

impl DiffSize {
    /// Added plus removed: what `diff.lines` matches.
    pub fn lines(&self) -> u64 {
        self.lines_added.saturating_add(self.lines_removed)
    }

    /// The `diff` object the policy sees and the events record.
    pub fn to_json(&self) -> Value {
        json!({
            "files": self.files,
            "lines_added": self.lines_added,
            "lines_removed": self.lines_removed,
            "lines": self.lines(),
        })
    }

    /// Counts one `git diff --numstat` line (without its newline).
    pub fn add_line(&mut self, line: &[u8]) -> Result<(), &'static str> {
        let (added, removed) = parse_line(line)?;
        self.files += 1;
        self.lines_added = self.lines_added.saturating_add(added);
        self.lines_removed = self.lines_removed.saturating_add(removed);
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    #[error("git diff could not run")]
    Spawn(#[source] std::io::Error),
    #[error("reading git diff's output")]
    Read(#[source] std::io::Error),
    #[error("git diff failed")]
    Git(#[source] GitError),
    #[error("git diff took over {}s", .0.as_secs())]
    Timeout(Duration),
    #[error("git diff output line {line}: {why}")]
    Unparsable { line: u64, why: &'static str },
    #[error("the push touches over {0} files")]
    TooManyFiles(u64),
}

/// `<added>\t<removed>\t<path>` as numstat writes it without `-z`: a
/// path with a tab or a newline in it is C-quoted, so one line is one
/// file. A binary file is `-\t-\t<path>` (no lines); a rename (`-M`) is
/// one line whatever its path field looks like.
pub fn parse_line(line: &[u8]) -> Result<(u64, u64), &'static str> {
    let mut f = line.splitn(3, |&b| b == b'\t');
    let (a, r, path) = (f.next(), f.next(), f.next());
    let (Some(a), Some(r), Some(path)) = (a, r, path) else {
        return Err("not <added> <removed> <path>");
    };
    if path.is_empty() {
        return Err("no path");
    }
    let count = |v: &[u8]| -> Result<Option<u64>, &'static str> {
        match v {
            b"-" => Ok(None),
            _ if !v.is_empty() && v.len() <= 20 && v.iter().all(u8::is_ascii_digit) => {
                std::str::from_utf8(v)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .map(Some)
                    .ok_or("count out of range")
            }
            _ => Err("count is not a number or `-`"),
        }
    };
    match (count(a)?, count(r)?) {
        (Some(a), Some(r)) => Ok((a, r)),
        (None, None) => Ok((0, 0)),
        _ => Err("one count is `-` and the other is not"),
    }
}

/// Measures `from..to`. Behind a trait so the broker's tests can make
/// measuring fail where real git would not.
#[async_trait::async_trait]
pub trait DiffSizer: Send + Sync {
    async fn size(&self, scratch: &Scratch, from: &str, to: &str) -> Result<DiffSize, DiffError>;
}

/// The real one: `git diff --numstat -M` in the scratch repository.
pub struct GitNumstat;

#[async_trait::async_trait]
impl DiffSizer for GitNumstat {
    async fn size(&self, scratch: &Scratch, from: &str, to: &str) -> Result<DiffSize, DiffError> {
        numstat(scratch, from, to, DIFF_TIMEOUT, MAX_FILES).await
    }
}

pub async fn numstat(
    scratch: &Scratch,
    from: &str,
    to: &str,
    deadline: Duration,
    max_files: u64,
) -> Result<DiffSize, DiffError> {
    // No ext diff or textconv can apply (no config is read), and `-M`
    // is explicit so a rename is one file whatever git's default.
    let args = [
        "diff",
        "--numstat",
        "-M",
        "--no-ext-diff",
        "--no-textconv",
        from,
        to,
        "--",
    ];
    let mut child = scratch
        .command(&args, None, &[])
        .spawn()
        .map_err(DiffError::Spawn)?;
    let stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let run = async {
        // stderr is drained alongside (a full pipe would stall git), and
        // only its first KiB kept for the error.
        let err = tokio::spawn(async move {
            let mut keep = Vec::new();
            let _ = (&mut stderr).take(1024).read_to_end(&mut keep).await;
            let _ = tokio::io::copy(&mut stderr, &mut tokio::io::sink()).await;
            keep
        });
        let mut size = DiffSize::default();
        let mut r = BufReader::new(stdout);
        let mut line = Vec::new();
        let mut n = 0u64;
        loop {
            line.clear();
            let got = (&mut r)
                .take(MAX_LINE_BYTES as u64 + 1)
                .read_until(b'\n', &mut line)
                .await
                .map_err(DiffError::Read)?;
            if got == 0 {
                break;
            }
            n += 1;
            if line.last() != Some(&b'\n') {
                let why = if line.len() > MAX_LINE_BYTES {
                    "longer than the cap"
                } else {
                    "no newline at the end"
                };
                return Err(DiffError::Unparsable { line: n, why });
            }
            line.pop();
            size.add_line(&line)
                .map_err(|why| DiffError::Unparsable { line: n, why })?;
            if size.files > max_files {
                return Err(DiffError::TooManyFiles(max_files));
            }
        }
        let status = child.wait().await.map_err(DiffError::Read)?;
        let stderr = err.await.unwrap_or_default();
        if !status.success() {
            return Err(DiffError::Git(GitError::Git {
                step: "diff",
                stderr: crate::cut::cut(String::from_utf8_lossy(&stderr).trim(), 1000),
            }));
        }
        Ok(size)
    };
    // On the deadline (or an early error) `child` is dropped with the
    // future and killed (kill_on_drop).
    tokio::time::timeout(deadline, run)
        .await
        .map_err(|_| DiffError::Timeout(deadline))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::git::tests::sh;

    #[test]
    fn numstat_lines() {
        assert_eq!(parse_line(b"3\t0\tc"), Ok((3, 0)));
        assert_eq!(parse_line(b"12\t7\tdir/a b.txt"), Ok((12, 7)));
        // Binary: a file, no lines.
        assert_eq!(parse_line(b"-\t-\tbin"), Ok((0, 0)));
        // Renames, both spellings git uses; a quoted path with a tab.
        assert_eq!(parse_line(b"0\t0\ta => b"), Ok((0, 0)));
        assert_eq!(parse_line(b"2\t1\tdir/{a => b}/x"), Ok((2, 1)));
        assert_eq!(parse_line(b"1\t0\t\"we\\tird\\nname\""), Ok((1, 0)));
        // A tab inside the path field stays in the path.
        assert_eq!(parse_line(b"1\t1\ta\tb"), Ok((1, 1)));
        for bad in [
            &b""[..],
            b"3\t0",
            b"3\t0\t",
            b"x\t0\tp",
            b"-\t3\tp",
            b"3\t-\tp",
            b"+3\t0\tp",
            b"99999999999999999999999\t0\tp",
            b" 3\t0\tp",
        ] {
            assert!(
                parse_line(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let mut s = DiffSize::default();
        for l in [&b"3\t2\ta"[..], b"-\t-\tbin", b"0\t0\tx => y"] {
            s.add_line(l).unwrap();
        }
        assert_eq!(
            s.to_json(),
            json!({"files": 3, "lines_added": 3, "lines_removed": 2, "lines": 5})
        );
        // Counts saturate instead of wrapping.
        let mut s = DiffSize::default();
        s.add_line(b"18446744073709551615\t1\ta").unwrap();
        assert_eq!(s.lines(), u64::MAX);
    }

    fn rev(dir: &std::path::Path, r: &str) -> String {
        let o = std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(["rev-parse", r])
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .output()
            .unwrap();
        String::from_utf8(o.stdout).unwrap().trim().to_string()
    }

    /// Real git on a real pair of commits: 800 added lines in one file,
    /// a binary change, a rename with no content change, a deleted file
    /// and a path with a newline in it.
    #[tokio::test]
    async fn measures_a_real_diff() {
        let s = Scratch::new(&std::env::temp_dir()).await.unwrap();
        let d = s.path();
        sh(
            d,
            "git init -q w && cd w && seq 1 100 > moved && printf 'x\\0y' > bin \
             && seq 1 5 > gone && git add . && git commit -qm one \
             && git mv moved renamed && printf 'x\\0z' > bin && git rm -q gone \
             && seq 1 800 > big && printf 'l\\n' > \"$(printf 'new\\nline')\" \
             && git add -A && git commit -qm two && git push -q .. HEAD:refs/heads/t",
        );
        let (a, b) = (rev(d, "t~1"), rev(d, "t"));
        let size = GitNumstat.size(&s, &a, &b).await.unwrap();
        assert_eq!(
            size,
            DiffSize {
                files: 5,
                lines_added: 801,
                lines_removed: 5,
            }
        );
        // Nothing changed: zero of everything.
        let none = GitNumstat.size(&s, &b, &b).await.unwrap();
        assert_eq!((none.files, none.lines()), (0, 0));
        // git failing (a commit that is not there) is an error, never a
        // size.
        let e = GitNumstat
            .size(&s, &a, "0123456789012345678901234567890123456789")
            .await
            .unwrap_err();
        assert!(matches!(e, DiffError::Git(_)), "{e:?}");
        // The file cap, at its boundary.
        let at = numstat(&s, &a, &b, DIFF_TIMEOUT, 5).await.unwrap();
        assert_eq!(at.files, 5);
        let e = numstat(&s, &a, &b, DIFF_TIMEOUT, 4).await.unwrap_err();
        assert!(matches!(e, DiffError::TooManyFiles(4)), "{e:?}");
    }
}
