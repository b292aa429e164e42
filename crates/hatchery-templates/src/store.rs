//! Templates on disk:
//!
//! ```text
//! <templates>/<name>/current               the active version's id
//! <templates>/<name>/versions/<ver>.json    the spec of each version
//! <templates>/<name>/rootfs-<key>/          a rootfs, shared by versions with
//!                                           the same base and packages
//! ```
//!
//! A rebuild writes a new version and then switches `current` with an
//! atomic rename: creates see the old or the new version, never a mix, and
//! sandboxes already running keep the rootfs they were started on.

use crate::spec::{valid_name, TemplateSpec};
use crate::TemplateError;
use hatchery_runtime::Limits;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone)]
pub struct Template {
    pub spec: TemplateSpec,
    pub version: String,
    pub rootfs: PathBuf,
}

impl Template {
    /// Identifies a checkpoint of this template made under `compat`
    /// (runtime and agent builds): a checkpoint is valid for one only.
    pub fn image_id(&self, compat: &str) -> String {
        use sha2::{Digest, Sha256};
        let h: String = Sha256::digest(format!("{}|{compat}", self.version).as_bytes())
            .iter()
            .take(8)
            .map(|b| format!("{b:02x}"))
            .collect();
        format!("{}-{}", self.spec.name, h)
    }

    /// The limits as a sandbox or snapshot row records them (JSON).
    pub fn limits_json(&self) -> String {
        // Four integers: serialising them cannot fail.
        serde_json::to_string(&self.limits()).unwrap_or_default()
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

    pub fn rootfs_dir(&self, spec: &TemplateSpec) -> PathBuf {
        self.dir
            .join(&spec.name)
            .join(format!("rootfs-{}", spec.rootfs_key()))
    }

    pub fn get(&self, name: &str) -> Result<Template, TemplateError> {
        if !valid_name(name) {
            return Err(TemplateError::InvalidName(name.to_string()));
        }
        let dir = self.dir.join(name);
        let version = std::fs::read_to_string(dir.join("current"))
            .map_err(|_| TemplateError::NotFound(name.to_string()))?
            .trim()
            .to_string();
        let broken = |why: String| TemplateError::Broken {
            name: name.to_string(),
            why,
        };
        let raw = std::fs::read(dir.join("versions").join(format!("{version}.json")))
            .map_err(|e| broken(format!("version {version}: {e}")))?;
        let spec: TemplateSpec = serde_json::from_slice(&raw).map_err(|e| broken(e.to_string()))?;
        let rootfs = self.rootfs_dir(&spec);
        if !rootfs.join(".complete").exists() {
            return Err(broken("rootfs missing".into()));
        }
        Ok(Template {
            spec,
            version,
            rootfs,
        })
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

    /// Records `spec` as a version and makes it the active one.
    pub fn activate(&self, spec: &TemplateSpec) -> Result<Template, TemplateError> {
        let dir = self.dir.join(&spec.name);
        let io = |e: std::io::Error| TemplateError::Io(e.to_string());
        std::fs::create_dir_all(dir.join("versions")).map_err(io)?;
        let version = spec.version();
        let body = serde_json::to_vec_pretty(spec).map_err(|e| TemplateError::Io(e.to_string()))?;
        std::fs::write(dir.join("versions").join(format!("{version}.json")), body).map_err(io)?;
        let tmp = dir.join("current.tmp");
        std::fs::write(&tmp, &version).map_err(io)?;
        std::fs::rename(&tmp, dir.join("current")).map_err(io)?;
        self.get(&spec.name)
    }

    /// Removes a template and everything it has on disk.
    pub fn remove(&self, name: &str) -> Result<(), TemplateError> {
        if !valid_name(name) {
            return Err(TemplateError::InvalidName(name.to_string()));
        }
        std::fs::remove_dir_all(self.dir.join(name)).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => TemplateError::NotFound(name.into()),
            _ => TemplateError::Io(e.to_string()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activate_get_list_remove() {
        let tmp = std::env::temp_dir().join(format!("hx-tpl-{}", std::process::id()));
        let ts = Templates::new(&tmp);
        let mut spec = TemplateSpec::named("py");
        spec.memory_mb = 128;
        assert!(matches!(ts.get("py"), Err(TemplateError::NotFound(_))));
        std::fs::create_dir_all(ts.rootfs_dir(&spec)).unwrap();
        assert!(
            matches!(ts.activate(&spec), Err(TemplateError::Broken { .. })),
            "no rootfs yet"
        );
        std::fs::write(ts.rootfs_dir(&spec).join(".complete"), "").unwrap();
        let t = ts.activate(&spec).unwrap();
        assert_eq!((t.spec.memory_mb, t.version.clone()), (128, spec.version()));
        let mut v2 = spec.clone();
        v2.setup.push("true".into());
        let t2 = ts.activate(&v2).unwrap();
        assert_ne!(t2.version, t.version);
        assert_eq!(t2.rootfs, t.rootfs, "same packages, same rootfs");
        assert_eq!(ts.list().len(), 1);
        assert_ne!(t.image_id("a"), t.image_id("b"));
        assert!(matches!(ts.get("../x"), Err(TemplateError::InvalidName(_))));
        ts.remove("py").unwrap();
        assert!(matches!(ts.remove("py"), Err(TemplateError::NotFound(_))));
        std::fs::remove_dir_all(&tmp).ok();
    }
}
