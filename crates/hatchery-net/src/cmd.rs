//! Runs the host tools (`ip`, `nft`, `conntrack`) with a script on stdin:
//! one process per batch, never one per rule.

use crate::NetError;
use std::io::Write;
use std::process::{Command, Stdio};

/// Runs `prog args…` with `script` on stdin; fails with its stderr.
pub fn run_script(prog: &str, args: &[&str], script: &str) -> Result<(), NetError> {
    let mut child = Command::new(prog)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| NetError::Command(format!("{prog}: {e}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(script.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if out.status.success() {
        return Ok(());
    }
    Err(NetError::Command(format!(
        "{prog} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}

/// Runs a command for its stdout; fails with its stderr.
pub fn output(prog: &str, args: &[&str]) -> Result<String, NetError> {
    let out = Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| NetError::Command(format!("{prog}: {e}")))?;
    if !out.status.success() {
        return Err(NetError::Command(format!(
            "{prog} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
