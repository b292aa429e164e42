//! What a template is made of. The spec is data (`POST /v1/templates`); its
//! content hash is the template's version.

use crate::TemplateError;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

pub const BASE_BOOKWORM: &str = "debian-bookworm";
/// Packages every template gets: the agent needs nothing, but a sandbox
/// without a shell, ps and python is not what anyone expects.
pub const BASE_PACKAGES: &[&str] = &["python3", "procps"];

pub const MAX_PACKAGES: usize = 64;
pub const MAX_FILES: usize = 64;
pub const MAX_FILES_BYTES: usize = 4 << 20;
pub const MAX_SETUP: usize = 32;
pub const MAX_SETUP_BYTES: usize = 16 * 1024;
pub const MAX_PIP: usize = 64;
pub const MAX_PIP_BYTES: usize = 200;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TemplateSpec {
    pub name: String,
    #[serde(default = "default_base")]
    pub base: String,
    /// Debian packages installed into the rootfs (from Debian's registry,
    /// on the host, at build time).
    #[serde(default)]
    pub packages: Vec<String>,
    /// Python requirements (`name`, `name==1.2`, `name[extra]>=1,<2`)
    /// installed into the rootfs's `/usr/local` by the host's pip at rootfs
    /// time, from the index the host's pip is configured for (PIP_INDEX_URL,
    /// PIP_FIND_LINKS, PIP_NO_INDEX in the daemon's environment). Not
    /// serialized when empty, so specs without it keep their versions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pip: Vec<String>,
    /// Files written into the build sandbox before setup: path -> content.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// Shell commands run in the build sandbox, in order; their effects are
    /// captured by the template checkpoint.
    #[serde(default)]
    pub setup: Vec<String>,
    #[serde(default = "default_cpus")]
    pub cpus: f64,
    #[serde(default = "default_memory")]
    pub memory_mb: u64,
    #[serde(default = "default_pids")]
    pub pids_max: u32,
    #[serde(default = "default_disk")]
    pub disk_mb: u64,
}

fn default_base() -> String {
    BASE_BOOKWORM.into()
}
fn default_cpus() -> f64 {
    1.0
}
fn default_memory() -> u64 {
    512
}
fn default_pids() -> u32 {
    256
}
fn default_disk() -> u64 {
    256
}

pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
}

fn valid_package(p: &str) -> bool {
    let b = p.as_bytes();
    !b.is_empty()
        && b.len() <= 100
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"+.-".contains(c))
}

/// A requirement specifier and nothing else: a name (PEP 508 letters,
/// digits, `._-`), optional extras and version clauses. No URLs, paths,
/// options (`-e`, `--index-url`) or environment markers, so a spec cannot
/// steer the host's pip anywhere.
fn valid_requirement(r: &str) -> bool {
    let b = r.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_PIP_BYTES
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"._-[],<>=!~".contains(c))
}

fn valid_guest_path(p: &str) -> bool {
    p.starts_with('/')
        && p.len() <= 4096
        && !p.contains('\0')
        && p.split('/')
            .skip(1)
            .all(|c| !c.is_empty() && c != "." && c != ".." && c.len() <= 255)
}

fn sha16(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl TemplateSpec {
    /// A spec with defaults, as the built-in `code-interpreter` is.
    pub fn named(name: &str) -> TemplateSpec {
        serde_json::from_value(serde_json::json!({ "name": name })).expect("defaults")
    }

    pub fn validate(&self) -> Result<(), TemplateError> {
        let bad = |why: String| Err(TemplateError::Invalid(why));
        if !valid_name(&self.name) {
            return Err(TemplateError::InvalidName(self.name.clone()));
        }
        if self.base != BASE_BOOKWORM {
            return bad(format!("base must be \"{BASE_BOOKWORM}\""));
        }
        if self.packages.len() > MAX_PACKAGES {
            return bad(format!("at most {MAX_PACKAGES} packages"));
        }
        if let Some(p) = self.packages.iter().find(|p| !valid_package(p)) {
            return bad(format!("invalid package name {p:?}"));
        }
        if self.pip.len() > MAX_PIP {
            return bad(format!("at most {MAX_PIP} pip requirements"));
        }
        if let Some(r) = self.pip.iter().find(|r| !valid_requirement(r)) {
            return bad(format!(
                "invalid pip requirement {r:?}: a name with optional [extras] and version clauses, \
                 at most {MAX_PIP_BYTES} bytes (no URLs, paths, options or markers)"
            ));
        }
        if self.files.len() > MAX_FILES {
            return bad(format!("at most {MAX_FILES} files"));
        }
        if let Some(p) = self.files.keys().find(|p| !valid_guest_path(p)) {
            return bad(format!("file path {p:?} must be absolute and normalized"));
        }
        if self
            .files
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum::<usize>()
            > MAX_FILES_BYTES
        {
            return bad(format!("files are over {MAX_FILES_BYTES} bytes in all"));
        }
        if self.setup.len() > MAX_SETUP
            || self
                .setup
                .iter()
                .any(|c| c.trim().is_empty() || c.len() > MAX_SETUP_BYTES)
        {
            return bad(format!(
                "setup: at most {MAX_SETUP} non-empty commands of at most {MAX_SETUP_BYTES} bytes"
            ));
        }
        if !(self.cpus >= 0.05 && self.cpus <= 16.0) {
            return bad("cpus must be between 0.05 and 16".into());
        }
        if !(64..=16384).contains(&self.memory_mb) {
            return bad("memory_mb must be between 64 and 16384".into());
        }
        if !(16..=4096).contains(&self.pids_max) {
            return bad("pids_max must be between 16 and 4096".into());
        }
        if !(16..=65536).contains(&self.disk_mb) {
            return bad("disk_mb must be between 16 and 65536".into());
        }
        Ok(())
    }

    /// Content hash of the whole spec: the template's version.
    pub fn version(&self) -> String {
        sha16(&serde_json::to_vec(self).unwrap_or_default())
    }

    /// What the rootfs depends on (base, packages and pip requirements,
    /// not setup): specs that differ only in setup or shape share one
    /// rootfs.
    pub fn rootfs_key(&self) -> String {
        let mut pkgs: Vec<&str> = BASE_PACKAGES
            .iter()
            .copied()
            .chain(self.packages.iter().map(String::as_str))
            .collect();
        pkgs.sort_unstable();
        pkgs.dedup();
        let mut key = format!("{}|{}", self.base, pkgs.join(","));
        // Appended only when present: rootfs built before pip existed keep
        // their keys.
        if !self.pip.is_empty() {
            key.push_str("|pip:");
            key.push_str(&self.pip.join(" "));
        }
        sha16(key.as_bytes())
    }

    pub fn all_packages(&self) -> Vec<String> {
        let mut pkgs: Vec<String> = BASE_PACKAGES
            .iter()
            .map(|s| s.to_string())
            .chain(self.packages.clone())
            .collect();
        pkgs.sort_unstable();
        pkgs.dedup();
        pkgs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pip_requirements() {
        for ok in [
            "mini-swe-agent==2.4.6",
            "requests",
            "a[b,c]>=1,<2",
            "x~=1.0",
            "Py.Thing_2!=3",
        ] {
            assert!(valid_requirement(ok), "{ok}");
        }
        for bad in [
            "",
            "-e .",
            "--index-url=http://x",
            "git+https://x/y",
            "./local",
            "/abs/path.whl",
            "x; python_version<'3'",
            "x @ https://h/x.whl",
            "a b",
            &"a".repeat(201),
        ] {
            assert!(!valid_requirement(bad), "{bad}");
        }
        let mut s = TemplateSpec::named("t");
        s.pip = vec!["--pre".into()];
        assert!(s.validate().is_err());
        s.pip = vec!["ok".into(); MAX_PIP + 1];
        assert!(s.validate().is_err());
        s.pip = vec!["ok".into(); MAX_PIP];
        assert!(s.validate().is_ok());
    }

    #[test]
    fn pip_changes_the_rootfs_but_not_old_versions() {
        let plain = TemplateSpec::named("t");
        assert!(!serde_json::to_string(&plain).unwrap().contains("pip"));
        let mut with = plain.clone();
        with.pip = vec!["requests".into()];
        assert_ne!(plain.rootfs_key(), with.rootfs_key());
        assert_ne!(plain.version(), with.version());
    }

    #[test]
    fn names() {
        assert!(valid_name("code-interpreter"));
        assert!(!valid_name("../etc"));
        assert!(!valid_name("Code"));
        assert!(!valid_name(""));
        assert!(!valid_name(&"a".repeat(65)));
    }

    #[test]
    fn validation_bounds() {
        let ok = TemplateSpec::named("t");
        assert!(ok.validate().is_ok());
        let mut s = ok.clone();
        s.packages = vec!["python3-numpy".into(), "g++".into()];
        assert!(s.validate().is_ok());
        for bad in ["", "Foo", "a b", "x;rm", "-x"] {
            let mut s = ok.clone();
            s.packages = vec![bad.into()];
            assert!(s.validate().is_err(), "{bad:?}");
        }
        let mut s = ok.clone();
        s.files.insert("rel/path".into(), "x".into());
        assert!(s.validate().is_err());
        let mut s = ok.clone();
        s.files.insert("/a/../b".into(), "x".into());
        assert!(s.validate().is_err());
        let mut s = ok.clone();
        s.memory_mb = 63;
        assert!(s.validate().is_err());
        s.memory_mb = 64;
        assert!(s.validate().is_ok());
        let mut s = ok.clone();
        s.base = "alpine".into();
        assert!(s.validate().is_err());
        let mut s = ok.clone();
        s.setup = vec![" ".into()];
        assert!(s.validate().is_err());
        assert!(serde_json::from_str::<TemplateSpec>(r#"{"name":"t","bogus":1}"#).is_err());
    }

    #[test]
    fn versions_follow_content() {
        let a = TemplateSpec::named("t");
        let mut b = a.clone();
        b.setup.push("echo hi".into());
        assert_ne!(a.version(), b.version());
        assert_eq!(
            a.rootfs_key(),
            b.rootfs_key(),
            "setup does not change the rootfs"
        );
        let mut c = a.clone();
        c.packages.push("jq".into());
        assert_ne!(a.rootfs_key(), c.rootfs_key());
        let mut d = a.clone();
        d.packages.push("python3".into());
        assert_eq!(a.rootfs_key(), d.rootfs_key(), "base packages are implied");
    }

    /// CI builds one rootfs for both: the e2b suite seeds `base` from the
    /// agent template's cache (tests/e2b/conftest.py), so a package added to
    /// one file and not the other would mean a second debootstrap.
    #[test]
    fn base_and_agent_session_share_a_rootfs() {
        let load = |name: &str| -> TemplateSpec {
            let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../templates/").to_string() + name;
            let raw = std::fs::read(&path).expect(&path);
            let spec: TemplateSpec = serde_json::from_slice(&raw).expect(&path);
            spec.validate().expect(&path);
            spec
        };
        let base = load("base.json");
        let agent = load("agent-session.json");
        assert_eq!(base.rootfs_key(), agent.rootfs_key());
        for p in ["git", "curl", "sudo", "ca-certificates", "python3-pip"] {
            assert!(base.packages.iter().any(|q| q == p), "base lacks {p}");
        }
    }
}
