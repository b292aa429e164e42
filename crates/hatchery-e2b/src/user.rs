//! E2B runs commands as a user (`user` by default, home `/home/user`, or
//! whoever `Authorization: Basic` names); Hatchery runs them as root. A
//! small shell prologue switches to the user (util-linux `setpriv`) when
//! the sandbox has one by that name, and stays root otherwise (templates
//! without a `user`, such as `code-interpreter`).

use crate::sandbox::Target;

pub const DEFAULT_USER: &str = "user";

pub fn user_of(t: &Target) -> &str {
    t.user.as_deref().unwrap_or(DEFAULT_USER)
}

pub fn home_of(user: &str) -> String {
    if user == "root" {
        "/root".into()
    } else {
        format!("/home/{user}")
    }
}

/// `$1` user, `$2` working directory (empty: the user's home), then the
/// program and its arguments.
const PROLOGUE: &str = r#"u="$1"; d="$2"; shift 2
if [ "$u" != root ] && h=$(getent passwd "$u" | cut -d: -f6) && [ -n "$h" ]; then
  export HOME="$h" USER="$u" LOGNAME="$u"
  if [ -n "$d" ]; then cd "$d" || exit 1; else cd "$h" 2>/dev/null || cd /; fi
  exec setpriv --reuid="$u" --regid="$u" --init-groups -- "$@"
fi
export HOME=/root USER=root LOGNAME=root
if [ -n "$d" ]; then cd "$d" || exit 1; else cd /root 2>/dev/null || cd /; fi
exec "$@""#;

/// The argv that runs `argv` as `user` in `cwd`.
pub fn wrap(user: &str, cwd: Option<&str>, argv: Vec<String>) -> Vec<String> {
    let mut out = vec![
        "/bin/sh".to_string(),
        "-c".to_string(),
        PROLOGUE.to_string(),
        "e2b".to_string(),
        user.to_string(),
        cwd.unwrap_or("").to_string(),
    ];
    out.extend(argv);
    out
}

/// An absolute, normalized path: relative ones are under the user's home
/// (as envd has it); `.` and `..` are folded. `None` for an empty path or
/// one with NUL.
pub fn resolve_path(user: &str, path: &str) -> Option<String> {
    if path.is_empty() || path.contains('\0') || path.len() > 4096 {
        return None;
    }
    let full = if path.starts_with('/') {
        path.to_string()
    } else if let Some(rest) = path.strip_prefix("~") {
        format!("{}/{}", home_of(user), rest.trim_start_matches('/'))
    } else {
        format!("{}/{}", home_of(user), path)
    };
    let mut parts: Vec<&str> = vec![];
    for c in full.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    Some(format!("/{}", parts.join("/")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        assert_eq!(
            resolve_path("user", "a.txt").as_deref(),
            Some("/home/user/a.txt")
        );
        assert_eq!(resolve_path("root", "a/../b").as_deref(), Some("/root/b"));
        assert_eq!(
            resolve_path("user", "/tmp//x/./y/").as_deref(),
            Some("/tmp/x/y")
        );
        assert_eq!(resolve_path("user", "/../..").as_deref(), Some("/"));
        assert_eq!(resolve_path("user", "~/x").as_deref(), Some("/home/user/x"));
        assert_eq!(resolve_path("user", ""), None);
        assert_eq!(resolve_path("user", "a\0b"), None);
    }

    #[test]
    fn wrap_passes_argv_through() {
        let a = wrap("user", None, vec!["/bin/bash".into(), "-l".into()]);
        assert_eq!(&a[3..], ["e2b", "user", "", "/bin/bash", "-l"]);
    }
}
