//! `hatchery serve ARGS...`: replaces this process with `hatcheryd ARGS...`.
//! The daemon is its own binary so that the CLI links only the client
//! (docs/cli.md, "serve"); `serve` stays for the habit and the scripts
//! that use it, and passes every argument (`--help` included) through.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct ServeArgs {
    /// hatcheryd's arguments (`hatchery serve --help` shows them).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<OsString>,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(
        "no hatcheryd next to {0} nor on PATH: install it beside `hatchery` \
         (docs/operations.md, \"Installing elsewhere\")"
    )]
    NotFound(PathBuf),
    #[error("cannot run {0}")]
    Exec(PathBuf, #[source] std::io::Error),
}

/// The daemon binary: beside this executable first (an install keeps them
/// together, and a build's target dir has both), then PATH.
fn daemon_binary(me: &Path) -> Option<PathBuf> {
    let beside = me.parent().map(|d| d.join("hatcheryd"));
    if let Some(b) = beside.filter(|b| b.is_file()) {
        return Some(b);
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join("hatcheryd"))
        .find(|c| c.is_file())
}

/// Execs the daemon; returns only when that failed.
pub fn exec_daemon(a: ServeArgs) -> ServeError {
    let me = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("hatchery"));
    let Some(bin) = daemon_binary(&me) else {
        return ServeError::NotFound(me);
    };
    let e = std::process::Command::new(&bin).args(&a.args).exec();
    ServeError::Exec(bin, e)
}

#[cfg(test)]
mod tests {
    use super::daemon_binary;

    #[test]
    fn the_daemon_beside_the_cli_wins() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("hatcheryd"), "").unwrap();
        let me = d.path().join("hatchery");
        assert_eq!(daemon_binary(&me), Some(d.path().join("hatcheryd")));
    }
}
