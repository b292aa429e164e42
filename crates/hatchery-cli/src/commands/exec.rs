//! `hatchery exec ID -- CMD...`: runs a command over the daemon's streaming
//! exec, writing its stdout and stderr to ours as they arrive, and exits with
//! the command's status.

use crate::client::{event_error, Api, EXIT_TIMEOUT};
use crate::commands::sandbox::{check_id, not_found};
use crate::output::{self, kv_map};
use anyhow::{bail, Context};
use clap::Args;
use serde_json::{json, Value};
use std::io::{Read, Write};

#[derive(Args)]
pub struct ExecArgs {
    /// Sandbox id.
    pub id: String,
    /// Working directory inside the sandbox (absolute).
    #[arg(long)]
    pub cwd: Option<String>,
    /// KEY=VALUE for this command, repeatable.
    #[arg(long = "env", short = 'e', value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Seconds before the command is killed (daemon default 60, max 3600).
    #[arg(long, short = 't')]
    pub timeout: Option<u64>,
    /// Send our stdin to the command (read to the end first; at most 1 MiB of UTF-8).
    #[arg(long, short = 'i')]
    pub stdin: bool,
    /// Output kept per stream, in bytes (daemon default 1 MiB); a stream
    /// that passes it ends the command.
    #[arg(long)]
    pub max_output_bytes: Option<u64>,
    /// CPU time the command and everything it starts may use, in ms; then
    /// all of it is killed. At most the timeout.
    #[arg(long, value_name = "MS")]
    pub cpu_limit_ms: Option<u64>,
    /// Start the command in the background and print its process id at once
    /// (then `hatchery ps`, `attach`, `wait`, `kill`). No timeout unless
    /// --timeout: it runs as long as the sandbox.
    #[arg(long, short = 'b')]
    pub background: bool,
    /// Wait for the end and print the whole result object as JSON instead of
    /// streaming (with --background: the new process's ProcessInfo).
    #[arg(long)]
    pub json: bool,
    /// The command. One argument runs through `/bin/sh -c`; several run as
    /// an argv without a shell.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true, num_args = 1..)]
    pub cmd: Vec<String>,
}

pub fn run(api: &Api, a: ExecArgs) -> anyhow::Result<i32> {
    check_id(&a.id, "sbx_")?;
    let mut body = json!({ "env": kv_map(&a.env, "--env")? });
    if let [one] = a.cmd.as_slice() {
        body["cmd"] = one.as_str().into();
    } else {
        body["argv"] = json!(a.cmd);
    }
    if let Some(c) = a.cwd {
        body["cwd"] = c.into();
    }
    if let Some(t) = a.timeout {
        body["timeout_seconds"] = t.into();
    }
    if let Some(m) = a.max_output_bytes {
        body["max_output_bytes"] = m.into();
    }
    if let Some(c) = a.cpu_limit_ms {
        body["cpu_limit_ms"] = c.into();
    }
    if a.stdin {
        let mut buf = Vec::new();
        std::io::stdin().read_to_end(&mut buf)?;
        body["stdin"] = String::from_utf8(buf)
            .context("--stdin takes UTF-8 text; copy binary input in with `hatchery cp`")?
            .into();
    }
    if a.background {
        body["background"] = true.into();
        let info = api
            .send("POST", &format!("/v1/sandboxes/{}/exec", a.id), &body)
            .map_err(|e| not_found(e, &a.id))?;
        output::show(a.json, &info, |v| println!("{}", output::s(&v["id"])));
        return Ok(0);
    }
    if a.json {
        let out = api
            .send("POST", &format!("/v1/sandboxes/{}/exec", a.id), &body)
            .map_err(|e| not_found(e, &a.id))?;
        output::json(&out);
        return Ok(status(&out, false));
    }
    let exit = stream(api, &a.id, &body, &mut |is_err, chunk| {
        write_chunk(is_err, chunk);
    })?;
    Ok(status(&exit, true))
}

/// Writes a chunk to stdout or stderr right away, so output interleaves as
/// it was produced.
pub fn write_chunk(is_err: bool, chunk: &str) {
    // A closed pipe (`| head`) is not worth a panic.
    let _ = if is_err {
        let mut e = std::io::stderr().lock();
        e.write_all(chunk.as_bytes()).and_then(|_| e.flush())
    } else {
        let mut o = std::io::stdout().lock();
        o.write_all(chunk.as_bytes()).and_then(|_| o.flush())
    };
}

/// Runs exec/stream, handing each output chunk to `sink` (true = stderr);
/// returns the `exit` event's object.
pub fn stream(
    api: &Api,
    id: &str,
    body: &Value,
    sink: &mut dyn FnMut(bool, &str),
) -> anyhow::Result<Value> {
    let events = api
        .events(
            "POST",
            &format!("/v1/sandboxes/{id}/exec/stream"),
            Some(body),
        )
        .map_err(|e| not_found(e, id))?;
    for ev in events {
        let ev = ev?;
        match ev.name.as_str() {
            "stdout" | "stderr" => {
                sink(ev.name == "stderr", ev.data["data"].as_str().unwrap_or(""))
            }
            "exit" => return Ok(ev.data),
            "error" => return Err(not_found(event_error(&ev.data), id)),
            _ => {}
        }
    }
    bail!("the daemon closed the exec stream before the command ended")
}

/// Our exit status for an exec result, with a note on stderr for what the
/// status alone does not say (why the command was stopped).
pub fn status(exit: &Value, notes: bool) -> i32 {
    if notes {
        for n in stop_notes(exit) {
            eprintln!("hatchery: {n}");
        }
    }
    if exit["timed_out"] == true || exit["reason"] == "timeout" {
        return EXIT_TIMEOUT;
    }
    match exit["exit_code"].as_i64() {
        Some(c @ 0..=255) => c as i32,
        _ => 255,
    }
}

/// Why an exec or code run was stopped, in words: one line per cause, from
/// its `reason` (timeout, cpu_limit, output_limit, oom) and the older
/// `truncated` / `oom_killed` / `timed_out` flags a daemon without `reason`
/// still sends.
pub fn stop_notes(end: &Value) -> Vec<String> {
    let reason = end["reason"].as_str().unwrap_or("");
    let mut notes = Vec::new();
    if reason == "output_limit" {
        notes.push(
            "output passed --max-output-bytes (per stream); the command was stopped (output_limit)"
                .into(),
        );
    } else if end["truncated"] == true {
        notes.push("output truncated at --max-output-bytes (per stream)".into());
    }
    if reason == "cpu_limit" {
        notes.push(format!(
            "the command used up its CPU time limit ({} ms of CPU) and was killed (cpu_limit)",
            end["cpu_ms"]
        ));
    }
    if reason == "oom" || end["oom_killed"] == true {
        notes.push("the sandbox ran out of memory during this command (OOM kill)".into());
    }
    if end["timed_out"] == true || reason == "timeout" {
        notes.push(format!(
            "command timed out after {} ms and was killed (exit {EXIT_TIMEOUT})",
            end["duration_ms"]
        ));
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_notes() {
        let ok = json!({"exit_code": 0, "reason": "exited", "timed_out": false});
        assert_eq!(status(&ok, false), 0);
        assert!(stop_notes(&ok).is_empty());
        let t =
            json!({"exit_code": 137, "reason": "timeout", "timed_out": true, "duration_ms": 1000});
        assert_eq!(status(&t, false), EXIT_TIMEOUT);
        assert_eq!(stop_notes(&t).len(), 1);
        assert!(stop_notes(&t)[0].contains("timed out after 1000 ms"));
        let cpu = json!({"exit_code": 137, "reason": "cpu_limit", "cpu_ms": 205});
        assert_eq!(status(&cpu, false), 137);
        assert!(
            stop_notes(&cpu)[0].contains("cpu_limit"),
            "{:?}",
            stop_notes(&cpu)
        );
        let out = json!({"exit_code": 137, "reason": "output_limit", "truncated": true});
        assert_eq!(stop_notes(&out).len(), 1);
        assert!(stop_notes(&out)[0].contains("output_limit"));
        let oom = json!({"exit_code": 137, "reason": "oom", "oom_killed": true});
        assert_eq!(stop_notes(&oom).len(), 1);
        // An older daemon: flags only.
        let old = json!({"exit_code": 0, "truncated": true});
        assert!(stop_notes(&old)[0].contains("truncated"));
    }
}
