//! Templates on disk. A template is a directory
//!
//! ```text
//! <templates>/<name>/template.json   shape: cpus, memory_mb, pids_max, disk_mb
//! <templates>/<name>/rootfs/         read-only root shared by its sandboxes
//! ```
//!
//! baked by `scripts/bake-template.sh` (debootstrap). The shape is fixed per
//! template: a create request cannot ask for more.

mod images;

pub use images::{ImageError, ImageStore, SealedImage};

use hatchery_runtime::Limits;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub const DEFAULT_TEMPLATE: &str = "code-interpreter";

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("template '{0}' not found")]
    NotFound(String),
    #[error("invalid template name '{0}': use 1-64 of [a-z0-9-]")]
    InvalidName(String),
    #[error("template '{name}' is broken: {why}")]
    Broken { name: String, why: String },
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TemplateSpec {
    pub name: String,
    #[serde(default = "default_cpus")]
    pub cpus: f64,
    #[serde(default = "default_memory")]
    pub memory_mb: u64,
    #[serde(default = "default_pids")]
    pub pids_max: u32,
    #[serde(default = "default_disk")]
    pub disk_mb: u64,
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

#[derive(Debug, Clone)]
pub struct Template {
    pub spec: TemplateSpec,
    pub rootfs: PathBuf,
}

impl Template {
    /// Content hash of what a sandbox of this template is made from: the
    /// spec, the rootfs (by its modification time) and `compat` (runtime
    /// and agent builds). A checkpoint is valid only for one version.
    pub fn version(&self, compat: &str) -> String {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        h.update(serde_json::to_vec(&self.spec).unwrap_or_default());
        let mtime = std::fs::metadata(&self.rootfs)
            .and_then(|m| m.modified())
            .ok();
        h.update(format!("{:?}|{}|{compat}", mtime, self.rootfs.display()));
        h.finalize()
            .iter()
            .take(8)
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    pub fn limits(&self) -> Limits {
        Limits {
            cpus: self.spec.cpus,
            memory_mb: self.spec.memory_mb,
            pids_max: self.spec.pids_max,
            disk_mb: self.spec.disk_mb,
        }
    }
}

pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
}

#[derive(Debug, Clone)]
pub struct Templates {
    dir: PathBuf,
}

impl Templates {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Templates { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn get(&self, name: &str) -> Result<Template, TemplateError> {
        if !valid_name(name) {
            return Err(TemplateError::InvalidName(name.to_string()));
        }
        let dir = self.dir.join(name);
        let raw = std::fs::read(dir.join("template.json"))
            .map_err(|_| TemplateError::NotFound(name.to_string()))?;
        let spec: TemplateSpec =
            serde_json::from_slice(&raw).map_err(|e| TemplateError::Broken {
                name: name.to_string(),
                why: e.to_string(),
            })?;
        let rootfs = dir.join("rootfs");
        if !rootfs.join("bin").exists() {
            return Err(TemplateError::Broken {
                name: name.to_string(),
                why: "rootfs missing".into(),
            });
        }
        Ok(Template { spec, rootfs })
    }

    pub fn list(&self) -> Vec<Template> {
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return vec![];
        };
        let mut out: Vec<Template> = rd
            .flatten()
            .filter_map(|e| self.get(&e.file_name().to_string_lossy()).ok())
            .collect();
        out.sort_by(|a, b| a.spec.name.cmp(&b.spec.name));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(valid_name("code-interpreter"));
        assert!(!valid_name("../etc"));
        assert!(!valid_name("Code"));
        assert!(!valid_name(""));
        assert!(!valid_name(&"a".repeat(65)));
    }

    #[test]
    fn loads_and_rejects() {
        let tmp = std::env::temp_dir().join(format!("hx-tpl-{}", std::process::id()));
        let t = tmp.join("py");
        std::fs::create_dir_all(t.join("rootfs/bin")).unwrap();
        std::fs::write(t.join("template.json"), r#"{"name":"py","memory_mb":128}"#).unwrap();
        let ts = Templates::new(&tmp);
        let got = ts.get("py").unwrap();
        assert_eq!(got.spec.memory_mb, 128);
        assert_eq!(got.spec.pids_max, 256);
        assert!(matches!(ts.get("nope"), Err(TemplateError::NotFound(_))));
        assert!(matches!(ts.get("../x"), Err(TemplateError::InvalidName(_))));
        std::fs::write(t.join("template.json"), "{").unwrap();
        assert!(matches!(ts.get("py"), Err(TemplateError::Broken { .. })));
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
