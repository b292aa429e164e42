//! A template spec read from a file (`--build-template PATH`): read,
//! parsed and validated when the configuration is, so a bad file stops
//! the daemon before it starts anything, naming the file.

use crate::spec::TemplateSpec;
use crate::TemplateError;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum SpecFileError {
    #[error("{}: cannot read it", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not a template spec (the JSON body of POST /v1/templates)", .path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{}: invalid template spec", .path.display())]
    Invalid {
        path: PathBuf,
        #[source]
        source: TemplateError,
    },
}

/// A valid spec and the file it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct SpecFile {
    pub path: PathBuf,
    pub spec: TemplateSpec,
}

impl SpecFile {
    pub fn read(path: &Path) -> Result<SpecFile, SpecFileError> {
        let path = path.to_path_buf();
        let raw = match std::fs::read(&path) {
            Ok(raw) => raw,
            Err(source) => return Err(SpecFileError::Read { path, source }),
        };
        let spec: TemplateSpec = match serde_json::from_slice(&raw) {
            Ok(spec) => spec,
            Err(source) => return Err(SpecFileError::Parse { path, source }),
        };
        if let Err(source) = spec.validate() {
            return Err(SpecFileError::Invalid { path, source });
        }
        Ok(SpecFile { path, spec })
    }
}

impl std::str::FromStr for SpecFile {
    type Err = SpecFileError;

    /// For a flag's value parser: the path, read at once.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SpecFile::read(Path::new(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_read_parsed_and_validated() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good.json");
        std::fs::write(&good, r#"{"name": "small", "setup": ["true"]}"#).unwrap();
        let f: SpecFile = good.to_str().unwrap().parse().unwrap();
        assert_eq!((f.spec.name.as_str(), f.path), ("small", good));

        let missing = dir.path().join("missing.json");
        let e = SpecFile::read(&missing).unwrap_err();
        assert!(matches!(e, SpecFileError::Read { .. }), "{e:?}");
        assert!(e.to_string().contains("missing.json"), "{e}");

        let junk = dir.path().join("junk.json");
        std::fs::write(&junk, r#"{"name": "x", "packags": []}"#).unwrap();
        let e = SpecFile::read(&junk).unwrap_err();
        assert!(matches!(e, SpecFileError::Parse { .. }), "{e:?}");
        assert!(
            e.to_string().starts_with(&junk.display().to_string()),
            "{e}"
        );

        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, r#"{"name": "Not Valid"}"#).unwrap();
        let e = SpecFile::read(&bad).unwrap_err();
        assert!(matches!(e, SpecFileError::Invalid { .. }), "{e:?}");
    }
}
