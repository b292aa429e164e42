//! Checks on what a caller sends, before anything is stored.

use crate::config::SessionsConfig;
use std::path::{Component, Path};

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ValidationError {
    #[error("{0}")]
    Invalid(String),
    #[error("repo: {0}")]
    Repo(String),
    #[error("budget: {0}")]
    Budget(String),
}

use ValidationError as V;

pub const MAX_TASK_BYTES: usize = 64 << 10;
pub const MAX_MESSAGE_BYTES: usize = 64 << 10;
pub const MAX_NOTE_BYTES: usize = 4 << 10;
pub const MAX_ENV_VARS: usize = 64;
pub const MAX_ENV_VALUE_BYTES: usize = 4096;
pub const MAX_URL_BYTES: usize = 2048;
/// A session's metadata is copied to each of its sandboxes, along with the
/// `hatchery_session` key, so it stays within a sandbox's caps (hatchery-core
/// caps.rs: 32 entries, keys 64 bytes, values 512 bytes) with room to spare.
pub const MAX_METADATA_ENTRIES: usize = 16;
pub const MAX_METADATA_KEY_BYTES: usize = 64;
pub const MAX_METADATA_VALUE_BYTES: usize = 512;
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = 200;

/// A repository URL: `https://host/path`, `git://host/path`, or
/// `file:///abs/path` under one of the operator's roots. No credentials
/// in the URL (the host adds its own), nothing git could read as an option.
pub fn repo_url(url: &str, cfg: &SessionsConfig) -> Result<(), ValidationError> {
    if url.is_empty() || url.len() > MAX_URL_BYTES {
        return Err(V::Repo(format!("must be 1..{MAX_URL_BYTES} bytes")));
    }
    if url.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(V::Repo("contains whitespace or control characters".into()));
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(V::Repo(format!(
            "{url:?} is not a URL (https://, git:// or file://; ssh and scp-style addresses are not supported)"
        )));
    };
    match scheme {
        "https" | "git" => {
            let authority = rest.split('/').next().unwrap_or("");
            if authority.contains('@') {
                return Err(V::Repo(
                    "credentials in the URL are refused; the host supplies its own".into(),
                ));
            }
            let host = authority
                .rsplit_once(':')
                .map(|(h, _)| h)
                .unwrap_or(authority);
            let host_ok = !host.is_empty()
                && !host.starts_with('-')
                && host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '[' | ']' | ':'));
            if !host_ok {
                return Err(V::Repo(format!("bad host {host:?}")));
            }
            if let Some((_, port)) = authority.rsplit_once(':') {
                if !authority.ends_with(']') && port.parse::<u16>().map_or(true, |p| p == 0) {
                    return Err(V::Repo(format!("bad port {port:?}")));
                }
            }
            let path = &rest[authority.len()..];
            if path.len() <= 1 {
                return Err(V::Repo("no repository path".into()));
            }
            Ok(())
        }
        "file" => {
            let p = Path::new(rest);
            if !p.is_absolute() || p.components().any(|c| matches!(c, Component::ParentDir)) {
                return Err(V::Repo(
                    "file:// needs an absolute path without `..`".into(),
                ));
            }
            if !cfg.file_repo_roots.iter().any(|r| p.starts_with(r)) {
                return Err(V::Repo(
                    "file:// repositories are allowed only under the operator's --sessions-file-repo-root".into(),
                ));
            }
            Ok(())
        }
        other => Err(V::Repo(format!(
            "scheme {other:?} is not allowed (https, git, or file under an allowed root)"
        ))),
    }
}

/// A branch, tag or commit: what `git clone --branch` or `git checkout`
/// takes, never an option.
pub fn git_ref(r: &str) -> Result<(), ValidationError> {
    let ok = !r.is_empty()
        && r.len() <= 200
        && !r.starts_with('-')
        && !r.starts_with('/')
        && !r.ends_with('/')
        && !r.contains("..")
        && !r.contains("//")
        && !r.ends_with(".lock")
        && r.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/'));
    if ok {
        Ok(())
    } else {
        Err(V::Invalid(format!(
            "ref {r:?} is not a valid branch, tag or commit"
        )))
    }
}

pub fn budget(
    tokens: i64,
    usd_cents: i64,
    wall_s: i64,
    cfg: &SessionsConfig,
) -> Result<(u64, u64, u64), ValidationError> {
    for (name, v) in [
        ("tokens", tokens),
        ("usd_cents", usd_cents),
        ("wall_s", wall_s),
    ] {
        if v < 0 {
            return Err(V::Budget(format!("{name} must not be negative (got {v})")));
        }
    }
    if wall_s == 0 {
        return Err(V::Budget("wall_s must be at least 1".into()));
    }
    for (name, v, cap) in [
        ("tokens", tokens as u64, cfg.max_tokens),
        ("usd_cents", usd_cents as u64, cfg.max_usd_cents),
        ("wall_s", wall_s as u64, cfg.max_wall_s),
    ] {
        if v > cap {
            return Err(V::Budget(format!(
                "{name} {v} is over the operator's cap of {cap}"
            )));
        }
    }
    Ok((tokens as u64, usd_cents as u64, wall_s as u64))
}

pub fn text(field: &str, s: &str, max: usize, allow_empty: bool) -> Result<(), ValidationError> {
    if !allow_empty && s.trim().is_empty() {
        return Err(V::Invalid(format!("{field} must not be empty")));
    }
    if s.len() > max {
        return Err(V::Invalid(format!(
            "{field} is {} bytes; at most {max}",
            s.len()
        )));
    }
    if s.contains('\0') {
        return Err(V::Invalid(format!("{field} contains NUL")));
    }
    Ok(())
}

pub fn env(env: &std::collections::BTreeMap<String, String>) -> Result<(), ValidationError> {
    if env.len() > MAX_ENV_VARS {
        return Err(V::Invalid(format!(
            "env has {} variables; at most {MAX_ENV_VARS}",
            env.len()
        )));
    }
    for (k, v) in env {
        let name_ok = !k.is_empty()
            && k.len() <= 128
            && !k.starts_with(|c: char| c.is_ascii_digit())
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !name_ok || k.starts_with("HATCHERY_") {
            return Err(V::Invalid(format!("env name {k:?} is not allowed")));
        }
        text(&format!("env.{k}"), v, MAX_ENV_VALUE_BYTES, true)?;
    }
    Ok(())
}

/// Labels for the session and its sandboxes; `hatchery_` keys are the
/// platform's own (`hatchery_session` names the session on a sandbox).
pub fn metadata(md: &std::collections::BTreeMap<String, String>) -> Result<(), ValidationError> {
    if md.len() > MAX_METADATA_ENTRIES {
        return Err(V::Invalid(format!(
            "metadata has {} entries; at most {MAX_METADATA_ENTRIES}",
            md.len()
        )));
    }
    for (k, v) in md {
        if k.is_empty() || k.len() > MAX_METADATA_KEY_BYTES || k.starts_with("hatchery_") {
            return Err(V::Invalid(format!(
                "metadata key {k:?} is not allowed (1 to {MAX_METADATA_KEY_BYTES} bytes, not hatchery_*)"
            )));
        }
        text(&format!("metadata.{k}"), v, MAX_METADATA_VALUE_BYTES, true)?;
    }
    Ok(())
}

/// The model URL the agent gets: plain http(s) to a sandbox-local address
/// (a host service) or elsewhere; checked only for shape, since the
/// sandbox's egress policy decides what it can reach.
pub fn model_url(u: &str) -> Result<(), ValidationError> {
    let ok = (u.starts_with("http://") || u.starts_with("https://"))
        && u.len() <= MAX_URL_BYTES
        && !u.chars().any(|c| c.is_control() || c.is_whitespace());
    if ok {
        Ok(())
    } else {
        Err(V::Invalid(format!(
            "agent.model_url {u:?} must be an http(s) URL"
        )))
    }
}

pub fn template_name(t: &str) -> Result<(), ValidationError> {
    let ok = !t.is_empty()
        && t.len() <= 64
        && !t.starts_with('-')
        && t.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok {
        Ok(())
    } else {
        Err(V::Invalid(format!(
            "template {t:?} is not a valid template name"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> SessionsConfig {
        SessionsConfig {
            file_repo_roots: vec!["/srv/repos".into()],
            ..Default::default()
        }
    }

    #[test]
    fn repos() {
        let c = cfg();
        for ok in [
            "https://github.com/acme/api.git",
            "git://127.0.0.1:9418/r.git",
            "file:///srv/repos/a.git",
        ] {
            assert_eq!(repo_url(ok, &c), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "ssh://host/r.git",
            "git@host:acme/api.git",
            "http://host/r.git",
            "https://user:pw@host/r.git",
            "https://host",
            "https://-oProxy/r",
            "file:///etc/passwd",
            "file:///srv/repos/../etc",
            "https://host/a b",
            "ext::sh -c id",
            "git://host:0/r",
        ] {
            assert!(repo_url(bad, &c).is_err(), "{bad}");
        }
    }

    #[test]
    fn refs() {
        for ok in ["main", "v1.2", "feature/x", "0123abcd"] {
            assert!(git_ref(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-c", "a..b", "x.lock", "a b", "/x", "x/"] {
            assert!(git_ref(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn budgets() {
        let c = cfg();
        assert!(budget(1, 0, 10, &c).is_ok());
        assert!(matches!(budget(-1, 0, 10, &c), Err(V::Budget(_))));
        assert!(matches!(budget(1, 0, 0, &c), Err(V::Budget(_))));
        assert!(matches!(
            budget(c.max_tokens as i64 + 1, 0, 10, &c),
            Err(V::Budget(_))
        ));
        assert!(budget(c.max_tokens as i64, 0, 10, &c).is_ok());
    }

    #[test]
    fn envs() {
        let mut e = std::collections::BTreeMap::new();
        e.insert("A_B".to_string(), "x".to_string());
        assert!(env(&e).is_ok());
        e.insert("HATCHERY_X".to_string(), "x".to_string());
        assert!(env(&e).is_err());
    }

    #[test]
    fn metadata_is_bounded_at_its_caps() {
        let md = |pairs: Vec<(String, String)>| pairs.into_iter().collect();
        let kv = |k: &str, v: &str| (k.to_string(), v.to_string());
        let k64 = "k".repeat(MAX_METADATA_KEY_BYTES);
        let v512 = "v".repeat(MAX_METADATA_VALUE_BYTES);
        assert!(metadata(&md(vec![
            kv("tenant", "acme"),
            kv(&k64, &v512),
            kv("e", "")
        ]))
        .is_ok());
        let full: Vec<_> = (0..MAX_METADATA_ENTRIES)
            .map(|i| kv(&format!("k{i}"), "v"))
            .collect();
        assert!(metadata(&md(full.clone())).is_ok());
        let mut over = full;
        over.push(kv("one_more", "v"));
        assert!(metadata(&md(over)).is_err());
        for bad in [
            kv("", "v"),
            kv(&format!("{k64}k"), "v"),
            kv("k", &format!("{v512}v")),
            kv("hatchery_session", "ses_x"),
            kv("k", "a\0b"),
        ] {
            assert!(metadata(&md(vec![bad.clone()])).is_err(), "{bad:?}");
        }
    }
}
