//! `hatchery secret create|list|delete`: the caller's secrets (the operator's, or a
//! tenant's own) that the
//! egress proxy injects into a session's requests (api.md, "Secrets";
//! policy.md, "Credentials"). A value is never an argument (argv is
//! readable by every local user through /proc): it comes from a file or
//! stdin, and no command prints it.

use crate::client::Api;
use crate::output::{self, table};
use anyhow::Context;
use clap::{ArgGroup, Subcommand};
use hatchery_client::{CreateSecret, SecretInfo};
use std::io::Read;
use std::path::PathBuf;

/// Read at most this much of a value's file or stdin: far above the
/// daemon's cap (4096 bytes), which answers anything between with its own
/// 400, and small enough that a wrong file (a disk image) is not read whole.
const MAX_READ: u64 = 64 * 1024;

#[derive(Subcommand)]
pub enum SecretCmd {
    /// Store a secret. One trailing newline of the value is dropped (files
    /// written with `echo` have one).
    #[command(group(ArgGroup::new("value").required(true).args(["value_file", "value_stdin"])))]
    Create {
        /// `[A-Za-z0-9_.-]`, 1–64 characters; policies name it.
        name: String,
        /// Read the value from this file.
        #[arg(long)]
        value_file: Option<PathBuf>,
        /// Read the value from standard input.
        #[arg(long)]
        value_stdin: bool,
        #[arg(long)]
        json: bool,
    },
    /// The secrets (names and sizes; never a value).
    #[command(alias = "ls")]
    List {
        #[arg(long)]
        json: bool,
    },
    /// Delete secrets. A session whose policy names one gets 503 from the
    /// proxy for requests that would have carried it.
    #[command(alias = "rm")]
    Delete {
        #[arg(required = true)]
        names: Vec<String>,
    },
}

pub fn run(api: &Api, cmd: SecretCmd) -> anyhow::Result<i32> {
    match cmd {
        SecretCmd::Create {
            name,
            value_file,
            value_stdin: _,
            json,
        } => {
            let value = match &value_file {
                Some(f) => {
                    let file = std::fs::File::open(f)
                        .with_context(|| format!("reading the value from {}", f.display()))?;
                    read_value(file).with_context(|| format!("{}", f.display()))?
                }
                None => read_value(std::io::stdin().lock()).context("standard input")?,
            };
            let req = CreateSecret { name, value };
            let made = api.run(api.c()?.create_secret(&req))?;
            output::show(json, &serde_json::to_value(&made)?, |_| {
                println!("{}", made.name)
            });
        }
        SecretCmd::List { json } => {
            let list = api.run(api.c()?.list_secrets())?;
            output::show(json, &serde_json::to_value(&list)?, |_| print(&list));
        }
        SecretCmd::Delete { names } => {
            for n in &names {
                api.run(api.c()?.delete_secret(n))?;
                println!("{n}");
            }
        }
    }
    Ok(0)
}

/// The value: UTF-8, one trailing `\n` (or `\r\n`) dropped; the daemon
/// checks the rest (printable ASCII, 1–4096 bytes).
fn read_value(r: impl Read) -> anyhow::Result<String> {
    let mut buf = Vec::new();
    r.take(MAX_READ + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > MAX_READ {
        anyhow::bail!("the value is over {MAX_READ} bytes; a secret is at most 4096");
    }
    if buf.ends_with(b"\n") {
        buf.pop();
        if buf.ends_with(b"\r") {
            buf.pop();
        }
    }
    let s = std::str::from_utf8(&buf).context("the value is not UTF-8")?;
    Ok(s.to_string())
}

fn print(list: &[SecretInfo]) {
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|s| {
            vec![
                s.name.clone(),
                s.tenant.clone().unwrap_or_else(|| "-".into()),
                s.bytes.to_string(),
                s.created_at.clone(),
            ]
        })
        .collect();
    table(&["NAME", "TENANT", "BYTES", "CREATED"], &rows);
}

#[cfg(test)]
mod tests {
    use super::read_value;

    #[test]
    fn one_trailing_newline_is_dropped() {
        assert_eq!(read_value(&b"tok\n"[..]).unwrap(), "tok");
        assert_eq!(read_value(&b"tok\r\n"[..]).unwrap(), "tok");
        assert_eq!(read_value(&b"tok\n\n"[..]).unwrap(), "tok\n");
        assert_eq!(read_value(&b"tok"[..]).unwrap(), "tok");
    }

    #[test]
    fn a_huge_or_binary_value_is_refused_before_sending() {
        let big = vec![b'a'; 64 * 1024 + 1];
        assert!(read_value(&big[..])
            .unwrap_err()
            .to_string()
            .contains("over"));
        assert!(read_value(&vec![b'a'; 64 * 1024][..]).is_ok());
        assert!(read_value(&[0xff, 0xfe][..]).is_err());
    }
}
