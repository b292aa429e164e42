//! The configuration file: read, checked key by key against the flags'
//! own parsers, then laid under the command line as the flags' defaults,
//! so a flag or an environment variable still beats it.

use crate::error::{ConfigError, Problem};
use crate::keys::{self, Key, Kind};
use clap::{Arg, Command};
use std::path::{Path, PathBuf};

/// A file's settings, each already valid for its flag, and its problems
/// (kept, not returned at once, so that they are reported together with
/// the rules the rest of the file breaks).
#[derive(Debug)]
pub struct FileSettings {
    pub path: PathBuf,
    pub values: Vec<(&'static Key, Vec<String>)>,
    pub problems: Vec<Problem>,
}

impl FileSettings {
    /// Reads `path`, checking every key of it against `cmd`'s flags.
    pub fn read(path: &Path, cmd: &Command) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(path, &text, cmd)
    }

    pub fn parse(path: &Path, text: &str, cmd: &Command) -> Result<Self, ConfigError> {
        let table: toml::Table = text.parse().map_err(|source| ConfigError::Syntax {
            path: path.to_path_buf(),
            source,
        })?;
        let file = || path.to_path_buf();
        let (mut values, mut problems) = (Vec::new(), Vec::new());
        for (section, v) in &table {
            let known = keys::SECTIONS.contains(&section.as_str());
            let Some(items) = v.as_table().filter(|_| known) else {
                problems.push(match known {
                    true => Problem::WrongType {
                        file: file(),
                        key: section.clone(),
                        expected: "a section ([name])",
                        found: type_name(v),
                    },
                    false => Problem::UnknownKey {
                        file: file(),
                        key: section.clone(),
                        section_known: false,
                    },
                });
                continue;
            };
            for (name, v) in items {
                let Some(key) = keys::find(section, name) else {
                    problems.push(Problem::UnknownKey {
                        file: file(),
                        key: format!("{section}.{name}"),
                        section_known: true,
                    });
                    continue;
                };
                let Some(strings) = as_strings(key.kind, v) else {
                    problems.push(Problem::WrongType {
                        file: file(),
                        key: key.path(),
                        expected: key.kind.describe(),
                        found: type_name(v),
                    });
                    continue;
                };
                match check(flag(cmd, key), &strings) {
                    Ok(()) => values.push((key, strings)),
                    Err(source) => problems.push(Problem::BadValue {
                        file: file(),
                        key: key.path(),
                        value: v.to_string(),
                        source,
                    }),
                }
            }
        }
        Ok(FileSettings {
            path: path.to_path_buf(),
            values,
            problems,
        })
    }

    /// `cmd` with this file's values as its flags' defaults.
    pub fn lay_under(&self, mut cmd: Command) -> Command {
        for (key, strings) in &self.values {
            let id = flag(&cmd, key).get_id().clone();
            // clap keeps defaults as &'static str (without its `string`
            // feature, which would rebuild every crate using clap): the
            // few values of one file, read once per process, are leaked.
            let leaked: Vec<&'static str> = strings
                .iter()
                .map(|s| &*Box::leak(s.clone().into_boxed_str()))
                .collect();
            cmd = cmd.mut_arg(id, |a| a.default_values(leaked));
        }
        cmd
    }

    /// Whether the file sets `key`.
    pub fn sets(&self, key: &Key) -> bool {
        self.values.iter().any(|(k, _)| std::ptr::eq(*k, key))
    }
}

/// The flag a key stands for (a test checks every key has one).
pub(crate) fn flag<'c>(cmd: &'c Command, key: &Key) -> &'c Arg {
    cmd.get_arguments()
        .find(|a| a.get_long() == Some(key.long))
        .unwrap_or_else(|| panic!("config key {} names no flag --{}", key.path(), key.long))
}

/// The value as the flag's arguments, if it has the key's TOML type.
fn as_strings(kind: Kind, v: &toml::Value) -> Option<Vec<String>> {
    use toml::Value as V;
    let one = match (kind, v) {
        (Kind::Int, V::Integer(i)) => i.to_string(),
        (Kind::Float, V::Float(f)) => f.to_string(),
        (Kind::Float, V::Integer(i)) => i.to_string(),
        (Kind::Bool, V::Boolean(b)) => b.to_string(),
        (Kind::Str, V::String(s)) => s.clone(),
        (Kind::List, V::Array(items)) => {
            return items
                .iter()
                .map(|i| i.as_str().map(str::to_string))
                .collect();
        }
        _ => return None,
    };
    Some(vec![one])
}

/// Runs the values through the flag's own parser (ranges, enums,
/// addresses), as if given on the command line.
fn check(arg: &Arg, strings: &[String]) -> Result<(), clap::Error> {
    if arg.get_action().takes_values() {
        let long = format!("--{}", arg.get_long().unwrap_or_default());
        let argv = std::iter::once("config".to_string())
            .chain(strings.iter().flat_map(|s| [long.clone(), s.clone()]));
        Command::new("config")
            .arg(arg.clone())
            .try_get_matches_from(argv)?;
    }
    Ok(())
}

fn type_name(v: &toml::Value) -> &'static str {
    match v {
        toml::Value::String(_) => "a string",
        toml::Value::Integer(_) => "an integer",
        toml::Value::Float(_) => "a number",
        toml::Value::Boolean(_) => "a boolean",
        toml::Value::Datetime(_) => "a date",
        toml::Value::Array(_) => "an array",
        toml::Value::Table(_) => "a table",
    }
}
