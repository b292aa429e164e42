//! hatcheryd's configuration: its flags (each also a key of the TOML file
//! `--config` names), the file laid under them, and the rules between them,
//! checked as a whole before anything starts (docs/operations.md,
//! "Configuration").

mod args;
mod error;
mod example;
mod file;
pub mod keys;
mod products;
mod roles;
mod rules;

pub use args::DaemonArgs;
pub use error::{ConfigError, Problem};
pub use file::FileSettings;
pub use products::{EgressArgs, GatewayArgs};
pub use roles::{NetworkMode, Role};

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// hatcheryd's command line: the daemon's flags, or `config ...`.
#[derive(Parser)]
#[command(name = "hatcheryd", about = "Hatchery sandbox daemon", version)]
pub struct Cli {
    #[command(flatten)]
    pub args: DaemonArgs,
    #[command(subcommand)]
    pub cmd: Option<Sub>,
}

#[derive(Subcommand)]
pub enum Sub {
    /// Configuration files: check one, or print an example.
    #[command(subcommand)]
    Config(ConfigCmd),
}

#[derive(Subcommand)]
pub enum ConfigCmd {
    /// Print every problem with FILE (and the HATCHERY_* variables set
    /// here, which beat it); exit 0 when there is none.
    Check { file: PathBuf },
    /// Print a commented example file for a role.
    Example {
        #[arg(long, value_enum, default_value_t = Role::All)]
        role: Role,
    },
}

/// What hatcheryd was asked to do.
pub enum Invocation {
    Run(Box<DaemonArgs>),
    /// `config check`: the file was fine (its problems are the error).
    Checked(PathBuf),
    /// `config example`: the text.
    Example(String),
}

/// Parses hatcheryd's command line, laying the `--config` file (or
/// `HATCHERY_CONFIG`'s) under it and checking the whole.
pub fn parse(argv: Vec<OsString>) -> Result<Invocation, ConfigError> {
    let file = match config_path(&argv) {
        Some(p) => Some(FileSettings::read(&p, &Cli::command())?),
        None => None,
    };
    let cli = resolve(file, argv)?;
    match cli.cmd {
        None => Ok(Invocation::Run(Box::new(cli.args))),
        Some(Sub::Config(ConfigCmd::Example { role })) => {
            Ok(Invocation::Example(example::example(&Cli::command(), role)))
        }
        Some(Sub::Config(ConfigCmd::Check { file })) => {
            check_file(&file)?;
            Ok(Invocation::Checked(file))
        }
    }
}

/// Every problem with the file at `path`, read as the daemon would.
pub fn check_file(path: &Path) -> Result<DaemonArgs, ConfigError> {
    let file = FileSettings::read(path, &Cli::command())?;
    Ok(resolve(Some(file), vec!["hatcheryd".into()])?.args)
}

/// The command line over the file, then the rules over the result: the
/// file's problems and the broken rules, all together.
fn resolve(mut file: Option<FileSettings>, argv: Vec<OsString>) -> Result<Cli, ConfigError> {
    let mut cmd = Cli::command();
    let mut problems = Vec::new();
    if let Some(f) = &mut file {
        problems = std::mem::take(&mut f.problems);
        cmd = f.lay_under(cmd);
    }
    let matches = cmd.try_get_matches_from_mut(argv)?;
    let cli = Cli::from_arg_matches(&matches)?;
    if cli.cmd.is_none() {
        let origins = rules::Origins {
            cmd: &cmd,
            matches: &matches,
            file: file.as_ref(),
        };
        problems.extend(rules::check(&cli.args, &origins));
    }
    match problems.is_empty() {
        true => Ok(cli),
        false => Err(ConfigError::Invalid(problems)),
    }
}

/// The `--config` of `argv`, else `HATCHERY_CONFIG`: read before the
/// command line is parsed, since its values become the flags' defaults.
fn config_path(argv: &[OsString]) -> Option<PathBuf> {
    let mut it = argv.iter().skip(1);
    while let Some(a) = it.next() {
        let a = a.to_string_lossy();
        if a == "--" {
            break;
        }
        if a == "--config" {
            return it.next().map(PathBuf::from);
        }
        if let Some(p) = a.strip_prefix("--config=") {
            return Some(PathBuf::from(p));
        }
    }
    std::env::var_os("HATCHERY_CONFIG").map(PathBuf::from)
}

#[cfg(test)]
mod tests;
