//! The work tree as a sandbox hands it over for `git_push`, and the only
//! thing the host takes from it: file and delete records in a grammar of
//! Hatchery's own. It is not git fast-import on purpose: nothing in it can
//! name a commit, a parent, a ref, an author or a mark, so a guest cannot
//! write the commit the broker pushes (issue 31, finding 2). The host
//! parses it strictly here, then writes the fast-import stream itself
//! (`git::prepare`), with its own commit header and quoting.
//!
//! ```text
//! stream = "hatchery-tree 1\n" [ "replace\n" ] *record "end\n"   (then nothing)
//! record = file / delete
//! file   = "file " mode " " pathlen " " datalen "\n" path data "\n"
//! delete = "delete " pathlen "\n" path "\n"
//! mode   = "100644" / "100755" / "120000"      (120000: data is the link target)
//! pathlen, datalen = decimal digits, no sign, no leading zero
//! ```
//!
//! `replace` makes the commit's tree exactly the stream's files (the
//! base's are not kept; `delete` is then meaningless and refused). Paths
//! are length-prefixed bytes, so no quoting is ever read from the guest.

use std::collections::BTreeSet;

/// The first line of every stream (the version is in it so that a later
/// grammar is refused by an older host, never misread).
pub const HEADER: &[u8] = b"hatchery-tree 1\n";
/// Most records in one stream (files and deletes).
pub const MAX_ENTRIES: usize = 100_000;
/// Longest path, and longest path component, in bytes.
pub const MAX_PATH_BYTES: usize = 4096;
pub const MAX_COMPONENT_BYTES: usize = 255;
/// Longest keyword line (`file 100644 4096 67108864` fits many times).
const MAX_LINE: usize = 80;

/// Words that start git fast-import commands or commit sub-commands; one
/// of them where a record should be is named in the error, so a guest
/// trying the old stream format (or the injection of issue 31) is told
/// plainly what was refused.
const FAST_IMPORT_WORDS: &[&str] = &[
    "commit",
    "merge",
    "from",
    "reset",
    "tag",
    "blob",
    "mark",
    "author",
    "committer",
    "tagger",
    "data",
    "deleteall",
    "M",
    "D",
    "C",
    "R",
    "N",
    "ls",
    "cat-blob",
    "get-mark",
    "checkpoint",
    "progress",
    "feature",
    "option",
    "done",
    "alias",
    "encoding",
    "original-oid",
];

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TreeError {
    #[error("not a tree stream: it must start with `hatchery-tree 1` (got {0:?})")]
    Header(String),
    #[error("the stream ends early at byte {at}: {what}")]
    Truncated { at: usize, what: &'static str },
    #[error(
        "`{word}` at byte {at} is a git fast-import command; a tree stream has only \
         `file` and `delete` records (the host writes the commit, its author, message and parent)"
    )]
    FastImport { at: usize, word: String },
    #[error("unknown record {line:?} at byte {at}")]
    Record { at: usize, line: String },
    #[error("bad {what} {value:?} at byte {at}")]
    Number {
        at: usize,
        what: &'static str,
        value: String,
    },
    #[error("mode {mode:?} at byte {at}: only 100644, 100755 and 120000 are allowed")]
    Mode { at: usize, mode: String },
    #[error("path {path:?} at byte {at}: {why}")]
    Path {
        at: usize,
        path: String,
        why: &'static str,
    },
    #[error("{what} at byte {at} is not followed by a newline (a wrong length?)")]
    Terminator { at: usize, what: &'static str },
    #[error("path {path:?} appears twice")]
    Duplicate { path: String },
    #[error("path {path:?} is a file and also a directory of {other:?}")]
    FileAndDirectory { path: String, other: String },
    #[error("`replace` must come first, right after the header (byte {at})")]
    LateReplace { at: usize },
    #[error("`delete` at byte {at} after `replace` (the tree is exactly the stream's files)")]
    DeleteAfterReplace { at: usize },
    #[error("more than {max} records")]
    TooManyEntries { max: usize },
    #[error("file data over {max} bytes in all")]
    TooLarge { max: u64 },
    #[error("{n} bytes after `end`")]
    Trailing { n: usize },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    File,
    Executable,
    Symlink,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::File => "100644",
            Mode::Executable => "100755",
            Mode::Symlink => "120000",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change<'a> {
    File {
        mode: Mode,
        path: &'a [u8],
        data: &'a [u8],
    },
    Delete {
        path: &'a [u8],
    },
}

/// A parsed, checked stream; it borrows the bytes it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeChanges<'a> {
    /// The tree is exactly the files below (else they change the base's).
    pub replace: bool,
    pub changes: Vec<Change<'a>>,
    /// File data bytes in all.
    pub data_bytes: u64,
}

/// How a path shows in an error: lossy, escaped, cut.
fn show(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(&b[..b.len().min(200)]).into_owned();
    if b.len() > 200 {
        format!("{s}…")
    } else {
        s
    }
}

struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    /// The next `\n`-terminated keyword line, without its newline.
    fn line(&mut self, what: &'static str) -> Result<(usize, &'a [u8]), TreeError> {
        let start = self.at;
        let rest = &self.b[start..];
        let window = &rest[..rest.len().min(MAX_LINE + 1)];
        match window.iter().position(|&c| c == b'\n') {
            Some(n) => {
                self.at += n + 1;
                Ok((start, &rest[..n]))
            }
            None if rest.len() > MAX_LINE => Err(TreeError::Record {
                at: start,
                line: show(&rest[..MAX_LINE]),
            }),
            None => Err(TreeError::Truncated { at: start, what }),
        }
    }

    fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8], TreeError> {
        let left = (self.b.len() - self.at) as u64;
        if n > left {
            return Err(TreeError::Truncated { at: self.at, what });
        }
        let s = &self.b[self.at..self.at + n as usize];
        self.at += n as usize;
        Ok(s)
    }

    fn newline(&mut self, what: &'static str) -> Result<(), TreeError> {
        match self.b.get(self.at) {
            Some(b'\n') => {
                self.at += 1;
                Ok(())
            }
            Some(_) => Err(TreeError::Terminator { at: self.at, what }),
            None => Err(TreeError::Truncated { at: self.at, what }),
        }
    }
}

/// A length: decimal digits only, no sign, no leading zero, at most 19
/// digits (so it fits a u64 without overflow checks going wrong).
fn number(at: usize, what: &'static str, w: &[u8]) -> Result<u64, TreeError> {
    let bad = || TreeError::Number {
        at,
        what,
        value: show(w),
    };
    if w.is_empty() || w.len() > 19 || !w.iter().all(u8::is_ascii_digit) {
        return Err(bad());
    }
    if w.len() > 1 && w[0] == b'0' {
        return Err(bad());
    }
    std::str::from_utf8(w)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(bad)
}

/// Code points HFS+ ignores when it compares names (git's
/// `is_hfs_dotgit`): `.g\u{200c}it` is `.git` on a Mac.
fn hfs_ignorable(c: char) -> bool {
    matches!(c, '\u{200c}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{206a}'..='\u{206f}' | '\u{feff}')
}

/// `.git` as any file system a clone may land on reads the component:
/// any case, trailing dots and spaces (NTFS), the NTFS short name
/// `git~1`, HFS+ ignorable code points. Git refuses these paths in trees
/// it checks out (`verify_path`); the broker refuses to push them.
fn is_dotgit(c: &[u8]) -> bool {
    let s: String = match std::str::from_utf8(c) {
        Ok(s) => s.chars().filter(|&ch| !hfs_ignorable(ch)).collect(),
        Err(_) => return false,
    };
    let s = s.to_ascii_lowercase();
    s.trim_end_matches([' ', '.']) == ".git" || s == "git~1"
}

/// Files git gives a meaning of its own; as symlinks they are refused by
/// `git fsck` (and were the way into CVE-2018-11235).
fn is_git_special(c: &[u8]) -> bool {
    let l = c.to_ascii_lowercase();
    [".gitmodules", ".gitattributes", ".gitignore", ".mailmap"]
        .iter()
        .any(|s| l == s.as_bytes())
}

/// Why `p` may not be a path in the pushed tree, if it may not.
pub fn path_problem(p: &[u8]) -> Option<&'static str> {
    if p.is_empty() {
        return Some("empty");
    }
    if p.len() > MAX_PATH_BYTES {
        return Some("longer than 4096 bytes");
    }
    if p[0] == b'/' {
        return Some("absolute");
    }
    if p.contains(&0) {
        return Some("contains a NUL byte");
    }
    for c in p.split(|&b| b == b'/') {
        if c.is_empty() {
            return Some("has an empty component (`//` or a trailing `/`)");
        }
        if c == b"." || c == b".." {
            return Some("has a `.` or `..` component");
        }
        if is_dotgit(c) {
            return Some("has a `.git` component");
        }
        if c.len() > MAX_COMPONENT_BYTES {
            return Some("has a component longer than 255 bytes");
        }
    }
    None
}

/// Parses and checks a whole stream. `max_data` caps the file bytes in
/// all. Nothing in an accepted stream can be anything but a path, a mode
/// and bytes.
pub fn parse(b: &[u8], max_data: u64) -> Result<TreeChanges<'_>, TreeError> {
    if !b.starts_with(HEADER) {
        let first = b.split(|&c| c == b'\n').next().unwrap_or_default();
        return Err(TreeError::Header(show(&first[..first.len().min(60)])));
    }
    let mut cur = Cursor {
        b,
        at: HEADER.len(),
    };
    let mut out = TreeChanges {
        replace: false,
        changes: Vec::new(),
        data_bytes: 0,
    };
    let mut seen: BTreeSet<&[u8]> = BTreeSet::new();
    let mut files: BTreeSet<&[u8]> = BTreeSet::new();
    let mut first = true;
    loop {
        let (at, line) = cur.line("no `end` record")?;
        let was_first = std::mem::replace(&mut first, false);
        let mut words = line.split(|&c| c == b' ');
        let word = words.next().unwrap_or_default();
        let args: Vec<&[u8]> = words.collect();
        match (word, args.as_slice()) {
            (b"end", []) => break,
            (b"replace", []) if was_first => out.replace = true,
            (b"replace", []) => return Err(TreeError::LateReplace { at }),
            (b"file", [mode, plen, dlen]) => {
                let mode = match *mode {
                    b"100644" => Mode::File,
                    b"100755" => Mode::Executable,
                    b"120000" => Mode::Symlink,
                    m => return Err(TreeError::Mode { at, mode: show(m) }),
                };
                let plen = number(at, "path length", plen)?;
                let dlen = number(at, "data length", dlen)?;
                let p_at = cur.at;
                let path = cur.take(plen, "path shorter than its length")?;
                if let Some(why) = path_problem(path) {
                    return Err(TreeError::Path {
                        at: p_at,
                        path: show(path),
                        why,
                    });
                }
                out.data_bytes = out.data_bytes.saturating_add(dlen);
                if out.data_bytes > max_data {
                    return Err(TreeError::TooLarge { max: max_data });
                }
                let data = cur.take(dlen, "file data shorter than its length")?;
                cur.newline("file data")?;
                if mode == Mode::Symlink {
                    let last = path.rsplit(|&c| c == b'/').next().unwrap_or(path);
                    let why = if data.is_empty() {
                        Some("is a symlink with an empty target")
                    } else if data.len() > MAX_PATH_BYTES {
                        Some("is a symlink with a target longer than 4096 bytes")
                    } else if data.contains(&0) {
                        Some("is a symlink whose target contains a NUL byte")
                    } else if is_git_special(last) {
                        Some("may not be a symlink (git gives that name a meaning)")
                    } else {
                        None
                    };
                    if let Some(why) = why {
                        return Err(TreeError::Path {
                            at: p_at,
                            path: show(path),
                            why,
                        });
                    }
                }
                if !seen.insert(path) {
                    return Err(TreeError::Duplicate { path: show(path) });
                }
                files.insert(path);
                out.changes.push(Change::File { mode, path, data });
            }
            (b"delete", [plen]) => {
                if out.replace {
                    return Err(TreeError::DeleteAfterReplace { at });
                }
                let plen = number(at, "path length", plen)?;
                let p_at = cur.at;
                let path = cur.take(plen, "path shorter than its length")?;
                if let Some(why) = path_problem(path) {
                    return Err(TreeError::Path {
                        at: p_at,
                        path: show(path),
                        why,
                    });
                }
                cur.newline("delete path")?;
                if !seen.insert(path) {
                    return Err(TreeError::Duplicate { path: show(path) });
                }
                out.changes.push(Change::Delete { path });
            }
            (w, _) => {
                let w = String::from_utf8_lossy(w);
                return Err(if FAST_IMPORT_WORDS.contains(&w.as_ref()) {
                    TreeError::FastImport {
                        at,
                        word: w.into_owned(),
                    }
                } else {
                    TreeError::Record {
                        at,
                        line: show(line),
                    }
                });
            }
        }
        if out.changes.len() > MAX_ENTRIES {
            return Err(TreeError::TooManyEntries { max: MAX_ENTRIES });
        }
    }
    if cur.at != b.len() {
        return Err(TreeError::Trailing {
            n: b.len() - cur.at,
        });
    }
    // A path written as a file may not also be a directory of another
    // written path: which one wins would be up to fast-import's order.
    for p in &files {
        for (i, &c) in p.iter().enumerate() {
            if c == b'/' && files.contains(&p[..i]) {
                return Err(TreeError::FileAndDirectory {
                    path: show(&p[..i]),
                    other: show(p),
                });
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A stream as `sandbox/export_tree.py` writes it (`replace`, then
    /// `file` records).
    pub(crate) fn stream(files: &[(&str, &[u8], &[u8])]) -> Vec<u8> {
        let mut o = HEADER.to_vec();
        o.extend_from_slice(b"replace\n");
        for (mode, path, data) in files {
            o.extend_from_slice(format!("file {mode} {} {}\n", path.len(), data.len()).as_bytes());
            o.extend_from_slice(path);
            o.extend_from_slice(data);
            o.push(b'\n');
        }
        o.extend_from_slice(b"end\n");
        o
    }

    const MAX: u64 = 1 << 20;

    #[test]
    fn a_stream_parses_into_its_records() {
        let mut s = HEADER.to_vec();
        s.extend_from_slice(b"file 100755 6 3\nrun.shhi\n\n");
        s.extend_from_slice(b"file 120000 4 6\nlinkrun.sh\n");
        s.extend_from_slice(b"delete 9\nold/x.txt\n");
        s.extend_from_slice(b"file 100644 1 0\ne\n");
        s.extend_from_slice(b"end\n");
        let t = parse(&s, MAX).unwrap();
        assert!(!t.replace);
        assert_eq!(t.data_bytes, 9);
        assert_eq!(
            t.changes,
            vec![
                Change::File {
                    mode: Mode::Executable,
                    path: b"run.sh",
                    data: b"hi\n"
                },
                Change::File {
                    mode: Mode::Symlink,
                    path: b"link",
                    data: b"run.sh"
                },
                Change::Delete { path: b"old/x.txt" },
                Change::File {
                    mode: Mode::File,
                    path: b"e",
                    data: b""
                },
            ]
        );
        let raw = stream(&[("100644", b"a/b", b"x")]);
        assert!(parse(&raw, MAX).unwrap().replace);
        // Bytes git allows in a path (not UTF-8, quotes, newlines) are
        // just bytes here: the length says where the path ends.
        let odd: &[u8] = b"d\"ir\\/\xff \nM 100644 inline x";
        let raw = stream(&[("100644", odd, b"y")]);
        let t = parse(&raw, MAX).unwrap();
        assert_eq!(
            t.changes,
            vec![Change::File {
                mode: Mode::File,
                path: odd,
                data: b"y"
            }]
        );
    }

    /// The injection of issue 31 in both shapes: the old fast-import
    /// stream, and fast-import commands after valid records.
    #[test]
    fn fast_import_commands_are_refused() {
        let old = b"deleteall\nM 100644 inline \"a\"\ndata 1\nx\n\
                    commit refs/hatchery/push\nauthor Evil <e@x> 0 +0000\n\
                    committer Evil <e@x> 0 +0000\ndata 3\nown\nmerge :1\n";
        assert!(matches!(parse(old, MAX), Err(TreeError::Header(_))));
        for cmd in [
            "commit refs/hatchery/push",
            "merge :1",
            "from 0000000000000000000000000000000000000000",
            "reset refs/hatchery/push",
            "tag v1",
            "blob",
            "mark :1",
            "M 100644 inline a",
            "deleteall",
            "feature import-marks=/etc/passwd",
        ] {
            let mut s = stream(&[("100644", b"a", b"x")]);
            s.truncate(s.len() - b"end\n".len());
            s.extend_from_slice(format!("{cmd}\nend\n").as_bytes());
            let e = parse(&s, MAX).unwrap_err();
            assert!(matches!(e, TreeError::FastImport { .. }), "{cmd}: {e}");
            assert!(e.to_string().contains("host writes the commit"), "{e}");
        }
    }

    #[test]
    fn malformed_streams_are_refused() {
        let ok = stream(&[("100644", b"a.txt", b"hello")]);
        // Truncated anywhere: never accepted.
        for n in 0..ok.len() {
            assert!(parse(&ok[..n], MAX).is_err(), "accepted {n} bytes");
        }
        assert!(parse(&ok, MAX).is_ok());
        let case = |s: &[u8]| parse(s, MAX).unwrap_err();
        let with = |rec: &[u8]| {
            let mut s = HEADER.to_vec();
            s.extend_from_slice(rec);
            s.extend_from_slice(b"end\n");
            s
        };
        // Lengths that lie.
        assert!(matches!(
            case(&with(b"file 100644 5 3\na.txthello\n")),
            TreeError::Terminator { .. }
        ));
        assert!(matches!(
            case(&with(b"file 100644 5 9\na.txthello\n")),
            TreeError::Truncated { .. } | TreeError::Terminator { .. }
        ));
        for n in [
            &b"-1"[..],
            b"+1",
            b"01",
            b"1e3",
            b"",
            b"99999999999999999999",
            b"0x1",
        ] {
            let mut r = b"file 100644 1 ".to_vec();
            r.extend_from_slice(n);
            r.extend_from_slice(b"\nax\n");
            assert!(
                matches!(case(&with(&r)), TreeError::Number { .. }),
                "{}",
                String::from_utf8_lossy(n)
            );
        }
        // Modes git would take but the grammar does not (a gitlink, a tree).
        for m in ["160000", "040000", "100664", "644"] {
            let r = format!("file {m} 1 1\nax\n");
            assert!(matches!(case(&with(r.as_bytes())), TreeError::Mode { .. }));
        }
        // Extra words, a missing word, an unknown record, trailing bytes.
        assert!(matches!(
            case(&with(b"file 100644 1 1 x\nax\n")),
            TreeError::Record { .. }
        ));
        assert!(matches!(
            case(&with(b"file 100644 1\na\n")),
            TreeError::Record { .. }
        ));
        assert!(matches!(
            case(&with(b"chmod a\n")),
            TreeError::Record { .. }
        ));
        let mut t = ok.clone();
        t.extend_from_slice(b"commit x\n");
        assert!(matches!(case(&t), TreeError::Trailing { .. }));
        // A keyword line with no end in sight is not read forever.
        let mut long = HEADER.to_vec();
        long.extend(std::iter::repeat_n(b'f', 10_000));
        assert!(matches!(case(&long), TreeError::Record { .. }));
        // `replace` only first; no `delete` after it; no path twice.
        assert!(matches!(
            case(&with(b"file 100644 1 0\na\nreplace\n")),
            TreeError::LateReplace { .. }
        ));
        assert!(matches!(
            case(&with(b"replace\ndelete 1\na\n")),
            TreeError::DeleteAfterReplace { .. }
        ));
        assert!(matches!(
            case(&with(b"file 100644 1 0\na\ndelete 1\na\n")),
            TreeError::Duplicate { .. }
        ));
        assert!(matches!(
            case(&with(b"file 100644 1 0\na\nfile 100644 3 0\na/b\n")),
            TreeError::FileAndDirectory { .. }
        ));
    }

    #[test]
    fn bad_paths_are_refused() {
        for (p, why) in [
            (&b""[..], "empty"),
            (b"/etc/passwd", "absolute"),
            (b"../x", ".."),
            (b"a/../../x", ".."),
            (b"a/./x", "`.`"),
            (b"a//b", "empty component"),
            (b"a/", "empty component"),
            (b".git/config", ".git"),
            (b"sub/.git/hooks/pre-commit", ".git"),
            (b".GIT/config", ".git"),
            (b".git./config", ".git"),
            (b".git /config", ".git"),
            (b"git~1/config", ".git"),
            (".g\u{200c}it/config".as_bytes(), ".git"),
            (b"a\0b", "NUL"),
        ] {
            assert!(
                path_problem(p).is_some_and(|w| w.contains(why)),
                "{:?}: {:?}",
                String::from_utf8_lossy(p),
                path_problem(p)
            );
            let e = parse(&stream(&[("100644", p, b"x")]), MAX).unwrap_err();
            assert!(matches!(e, TreeError::Path { .. }), "{e}");
        }
        assert!(path_problem(&vec![b'a'; 4097]).is_some());
        assert!(path_problem(&[b'a'; 256]).is_some());
        assert!(path_problem(&[b'a'; 255]).is_none());
        for ok in [
            &b".gitignore"[..],
            b".github/x",
            b"a.git",
            b"x/.gitx",
            b"..a",
        ] {
            assert_eq!(path_problem(ok), None, "{}", String::from_utf8_lossy(ok));
        }
        // Symlinks: a target, and not under a name git reads.
        for (p, target) in [
            (&b".gitmodules"[..], &b"x"[..]),
            (b"sub/.GitAttributes", b"x"),
            (b"l", b""),
            (b"l", b"a\0b"),
        ] {
            let e = parse(&stream(&[("120000", p, target)]), MAX).unwrap_err();
            assert!(matches!(e, TreeError::Path { .. }), "{e}");
        }
        assert!(parse(&stream(&[("100644", b".gitmodules", b"x")]), MAX).is_ok());
    }

    /// Both sides agree: what `sandbox/export_tree.py` writes of a real
    /// directory (run with the real python3) is what the host parses:
    /// modes, symlinks, bytes that are not UTF-8, and no `.git` or
    /// `__pycache__`.
    #[test]
    fn the_export_script_writes_what_the_host_parses() {
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let w = d.path().join("w");
        for dir in ["w/src", "w/.git", "w/sub/.GIT", "w/__pycache__"] {
            std::fs::create_dir_all(d.path().join(dir)).unwrap();
        }
        std::fs::write(w.join("src/a.txt"), b"a\n").unwrap();
        std::fs::write(w.join("run.sh"), b"#!/bin/sh\n").unwrap();
        std::fs::set_permissions(w.join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink("src/a.txt", w.join("link")).unwrap();
        let odd = std::ffi::OsStr::from_bytes(b"caf\xe9 \"x\"\nM");
        std::fs::write(w.join(odd), b"odd").unwrap();
        std::fs::write(w.join(".git/config"), b"[core]").unwrap();
        std::fs::write(w.join("sub/.GIT/HEAD"), b"ref").unwrap();
        std::fs::write(w.join("__pycache__/x.pyc"), b"pyc").unwrap();
        let out = d.path().join("tree");
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/sandbox/export_tree.py");
        let st = std::process::Command::new("python3")
            .args([
                script.as_ref(),
                w.as_os_str(),
                out.as_os_str(),
                "1000".as_ref(),
            ])
            .status()
            .unwrap();
        assert!(st.success());
        let raw = std::fs::read(&out).unwrap();
        let t = parse(&raw, 1000).unwrap();
        assert!(t.replace);
        let mut got: Vec<(Mode, Vec<u8>, Vec<u8>)> = t
            .changes
            .iter()
            .map(|c| match c {
                Change::File { mode, path, data } => (*mode, path.to_vec(), data.to_vec()),
                Change::Delete { .. } => panic!("a delete from the export"),
            })
            .collect();
        got.sort_by(|a, b| a.1.cmp(&b.1));
        let mut want = vec![
            (Mode::File, b"caf\xe9 \"x\"\nM".to_vec(), b"odd".to_vec()),
            (Mode::Symlink, b"link".to_vec(), b"src/a.txt".to_vec()),
            (
                Mode::Executable,
                b"run.sh".to_vec(),
                b"#!/bin/sh\n".to_vec(),
            ),
            (Mode::File, b"src/a.txt".to_vec(), b"a\n".to_vec()),
        ];
        want.sort_by(|a, b| a.1.cmp(&b.1));
        assert_eq!(got, want);
        // Over its cap, the script stops and says so.
        let st = std::process::Command::new("python3")
            .args([
                script.as_ref(),
                w.as_os_str(),
                out.as_os_str(),
                "5".as_ref(),
            ])
            .output()
            .unwrap();
        assert_eq!(st.status.code(), Some(3));
    }

    #[test]
    fn size_caps() {
        // Data over the cap, counted before it is read.
        let big = vec![b'x'; 2000];
        let s = stream(&[("100644", b"a", &big), ("100644", b"b", &big)]);
        assert_eq!(
            parse(&s, 3000).unwrap_err(),
            TreeError::TooLarge { max: 3000 }
        );
        assert!(parse(&s, 4000).is_ok());
        // A claimed length far past the cap is refused without reading.
        let mut s = HEADER.to_vec();
        s.extend_from_slice(b"file 100644 1 9000000000000000000\na");
        assert!(matches!(parse(&s, MAX), Err(TreeError::TooLarge { .. })));
        // Too many records.
        let names: Vec<String> = (0..=MAX_ENTRIES).map(|i| format!("f{i}")).collect();
        let files: Vec<(&str, &[u8], &[u8])> = names
            .iter()
            .map(|n| ("100644", n.as_bytes(), &b""[..]))
            .collect();
        assert_eq!(
            parse(&stream(&files), MAX).unwrap_err(),
            TreeError::TooManyEntries { max: MAX_ENTRIES }
        );
        assert!(parse(&stream(&files[..MAX_ENTRIES]), MAX).is_ok());
    }
}
