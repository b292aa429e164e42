//! What can be wrong with a configuration. Every problem is found before
//! the daemon starts anything, all of them at once, each naming its key
//! (and the file, when the value came from one).

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{}: cannot read it", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not valid TOML", .path.display())]
    Syntax {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("{}", Lines(.0))]
    Invalid(Vec<Problem>),
    /// The command line itself (flags, variables): clap's own error, which
    /// the binary prints and exits with as usual.
    #[error(transparent)]
    Cli(#[from] clap::Error),
}

/// One problem with one key.
#[derive(Debug, thiserror::Error)]
pub enum Problem {
    #[error("{}: unknown key `{key}`{}", .file.display(), hint(.section_known))]
    UnknownKey {
        file: PathBuf,
        key: String,
        /// Whether its section exists (then only the name is wrong).
        section_known: bool,
    },
    #[error("{}: `{key}` must be {expected}, not {found}", .file.display())]
    WrongType {
        file: PathBuf,
        key: String,
        expected: &'static str,
        found: &'static str,
    },
    #[error("{}: `{key}` = {value}: {}", .file.display(), reason(.source))]
    BadValue {
        file: PathBuf,
        key: String,
        value: String,
        /// The flag's own parser's verdict (the same rules as on the
        /// command line).
        #[source]
        source: clap::Error,
    },
    /// A rule between keys (`at` says where the value came from).
    #[error("{at}: {message}")]
    Rule { at: String, message: String },
}

fn hint(section_known: &bool) -> &'static str {
    if *section_known {
        " (`hatcheryd config example` lists every key)"
    } else {
        " (no such section; `hatcheryd config example` lists them)"
    }
}

/// The reason inside a clap error, without its usage text.
fn reason(e: &clap::Error) -> String {
    use clap::error::{ContextKind, ContextValue};
    if let Some(src) = std::error::Error::source(e) {
        return src.to_string();
    }
    match e.get(ContextKind::ValidValue) {
        Some(ContextValue::Strings(v)) => format!("must be one of {}", v.join(", ")),
        _ => e.kind().to_string(),
    }
}

/// Problems one per line.
struct Lines<'a>(&'a [Problem]);

impl std::fmt::Display for Lines<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}
