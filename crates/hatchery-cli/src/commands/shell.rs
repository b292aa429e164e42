//! `hatchery shell ID`. On a terminal, a real one in the sandbox (see
//! `terminal.rs`). Otherwise (stdin a pipe or a file, or `--lines`) a
//! line-based shell: each line runs as its own `/bin/sh -c` exec; the
//! working directory carries over between lines (shell variables do not),
//! and stdin of each command is empty.

use crate::client::Api;
use crate::commands::exec::{status, stream, write_chunk};
use crate::commands::sandbox::get;
use serde_json::json;
use std::io::{BufRead, IsTerminal, Write};

/// Printed on stderr after each command so we learn where `cd` left it.
const MARK: &str = "\x1eHXCWD ";

pub fn run(
    api: &Api,
    id: &str,
    cwd: Option<String>,
    lines: bool,
    cmd: &[String],
) -> anyhow::Result<i32> {
    get(api, id)?;
    let interactive = std::io::stdin().is_terminal();
    if interactive && !lines {
        return crate::commands::terminal::run(api, id, cwd.as_deref(), cmd);
    }
    if !cmd.is_empty() {
        anyhow::bail!(
            "a program after -- needs a terminal (stdin is not one, or --lines was given); \
             use `hatchery exec {id} -- ...` instead"
        );
    }
    if interactive {
        eprintln!(
            "hatchery: line-based shell in {id} (one command per line, the directory \
             carries over, variables do not). Ctrl-D or `exit` leaves; Ctrl-C kills the command and leaves."
        );
    }
    let mut cwd = cwd.unwrap_or_else(|| "/".to_string());
    let mut last = 0;
    let mut stdin = std::io::stdin().lock();
    loop {
        if interactive {
            eprint!("{id}:{cwd}# ");
            let _ = std::io::stderr().flush();
        }
        let mut line = String::new();
        if stdin.read_line(&mut line)? == 0 {
            break;
        }
        let line = line.trim();
        match line {
            "" => continue,
            "exit" | "logout" => break,
            _ => {}
        }
        let cmd = format!(
            "{line}\n__hx_rc=$?; printf '{}%s\\n' \"$PWD\" >&2; exit $__hx_rc",
            MARK.replace('\x1e', "\\036")
        );
        let body = json!({ "cmd": cmd, "cwd": cwd, "timeout_seconds": 3600 });
        let mut new_cwd = None;
        let result = stream(api, id, &body, &mut |is_err, chunk| match chunk
            .find(MARK)
            .filter(|_| is_err)
        {
            Some(at) => {
                write_chunk(true, &chunk[..at]);
                let rest = &chunk[at + MARK.len()..];
                let (dir, after) = rest.split_once('\n').unwrap_or((rest, ""));
                new_cwd = Some(dir.to_string());
                write_chunk(true, after);
            }
            None => write_chunk(is_err, chunk),
        });
        let exit = match result {
            Ok(exit) => exit,
            Err(e) => {
                // A gone sandbox ends the shell; anything else (a vanished
                // working directory, say) only this line.
                get(api, id)?;
                eprintln!("hatchery: {e:#}");
                last = 1;
                continue;
            }
        };
        if let Some(d) = new_cwd.filter(|d| d.starts_with('/')) {
            cwd = d;
        }
        last = status(&exit, true);
    }
    Ok(last)
}
