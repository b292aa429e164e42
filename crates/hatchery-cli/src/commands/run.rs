//! `hatchery run FILE`: a fresh sandbox, the file copied in and run, its
//! output streamed, and the sandbox destroyed whatever happens.
//! `hatchery run --code FILE|-`: the same fresh sandbox, but the code goes
//! to the Python interpreter already running in it (the daemon's run_code),
//! so nothing is copied and no python3 is started.

use crate::cleanup::create_owned;
use crate::client::{event_error, Api, EXIT_HATCHERY, EXIT_TIMEOUT};
use crate::commands::exec::{status, stop_notes, stream, write_chunk};
use crate::commands::sandbox::not_found;
use crate::output::{kv_map, s};
use anyhow::{bail, Context};
use clap::Args;
use serde_json::{json, Value};
use std::io::Read;
use std::path::PathBuf;

#[derive(Args)]
pub struct RunArgs {
    /// The program: .py runs with python3, .sh with sh; anything else needs --interpreter.
    #[arg(required_unless_present = "code", conflicts_with = "code")]
    pub file: Option<PathBuf>,
    /// Python code to run in the sandbox's interpreter instead (a file, or
    /// `-` for stdin): output as it comes, results' text, the traceback on
    /// stderr; exit 1 when it raised.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["interpreter", "stdin", "args"])]
    pub code: Option<String>,
    /// Template to start from.
    #[arg(long, default_value = "code-interpreter")]
    pub template: String,
    /// Command that runs the file (for example `python3 -u`).
    #[arg(long)]
    pub interpreter: Option<String>,
    /// Seconds before the program is killed (daemon default 60, max 3600;
    /// 30 for --code).
    #[arg(long, short = 't')]
    pub timeout: Option<u64>,
    /// CPU time the program may use, in ms; then it is killed. At most the timeout.
    #[arg(long, value_name = "MS")]
    pub cpu_limit_ms: Option<u64>,
    /// KEY=VALUE for the program, repeatable.
    #[arg(long = "env", short = 'e', value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Send our stdin to the program (read to the end first; at most 1 MiB of UTF-8).
    #[arg(long, short = 'i')]
    pub stdin: bool,
    /// Arguments for the program (after `--`).
    #[arg(last = true)]
    pub args: Vec<String>,
}

pub fn run(api: &Api, a: RunArgs) -> anyhow::Result<i32> {
    if let Some(src) = a.code.clone() {
        return run_code(api, a, &src);
    }
    let file = a.file.clone().context("give a FILE or --code")?;
    let code = std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
    let name = file
        .file_name()
        .context("the file has no name")?
        .to_string_lossy()
        .into_owned();
    let interp: Vec<String> = match (&a.interpreter, file.extension().and_then(|e| e.to_str())) {
        (Some(i), _) => i.split_whitespace().map(str::to_string).collect(),
        (None, Some("py")) => vec!["python3".into(), "-u".into()],
        (None, Some("sh")) => vec!["sh".into()],
        _ => bail!(
            "do not know how to run {name}: give --interpreter (for example --interpreter python3)"
        ),
    };
    if interp.is_empty() {
        bail!("--interpreter is empty");
    }
    let mut exec = json!({
        "argv": interp.into_iter().chain([format!("/workspace/{name}")]).chain(a.args).collect::<Vec<_>>(),
        "cwd": "/workspace",
        "env": kv_map(&a.env, "--env")?,
    });
    let mut create = json!({ "template": a.template, "metadata": { "hatchery-run": name } });
    if let Some(t) = a.timeout {
        exec["timeout_seconds"] = t.into();
        // The sandbox must outlive the program, with room for the copy.
        create["ttl_seconds"] = (t + 60).max(300).into();
    }
    if let Some(c) = a.cpu_limit_ms {
        exec["cpu_limit_ms"] = c.into();
    }
    if a.stdin {
        let mut buf = Vec::new();
        std::io::stdin().read_to_end(&mut buf)?;
        exec["stdin"] = String::from_utf8(buf)
            .context("--stdin takes UTF-8 text")?
            .into();
    }
    let sbx = create_owned(api, || {
        Ok(s(&api.send("POST", "/v1/sandboxes", &create)?["id"]))
    })?;
    api.upload(&sbx.id, &format!("/workspace/{name}"), code)
        .context("copying the file in")?;
    let exit = stream(api, &sbx.id, &exec, &mut write_chunk)?;
    Ok(status(&exit, true))
}

/// `run --code`: the code through `POST .../code/stream` in a fresh sandbox.
fn run_code(api: &Api, a: RunArgs, src: &str) -> anyhow::Result<i32> {
    // Read everything before a sandbox exists, so a slow or broken stdin
    // costs nothing on the daemon.
    let (code, name) = if src == "-" {
        let mut buf = Vec::new();
        std::io::stdin()
            .read_to_end(&mut buf)
            .context("reading the code from stdin")?;
        (buf, "stdin".to_string())
    } else {
        let path = PathBuf::from(src);
        let code = std::fs::read(&path).with_context(|| format!("reading {src}"))?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| src.to_string());
        (code, name)
    };
    let code = String::from_utf8(code).context("--code takes UTF-8 text")?;
    let mut body = json!({ "code": code, "env": kv_map(&a.env, "--env")? });
    let mut create = json!({ "template": a.template, "metadata": { "hatchery-run": name } });
    if let Some(t) = a.timeout {
        body["timeout_seconds"] = t.into();
        create["ttl_seconds"] = (t + 60).max(300).into();
    }
    if let Some(c) = a.cpu_limit_ms {
        body["cpu_limit_ms"] = c.into();
    }
    let sbx = create_owned(api, || {
        Ok(s(&api.send("POST", "/v1/sandboxes", &create)?["id"]))
    })?;
    let done = code_stream(api, &sbx.id, &body)?;
    Ok(code_status(&done, true))
}

/// Runs code/stream: stdout and stderr to ours as they arrive, each
/// result's text/plain to stdout, the error's traceback to stderr. Returns
/// the `done` event's summary, with the streamed `error` in it (the
/// daemon's streamed summary leaves its `error` null: the event carried it).
fn code_stream(api: &Api, id: &str, body: &Value) -> anyhow::Result<Value> {
    let mut error = Value::Null;
    let events = api
        .events(
            "POST",
            &format!("/v1/sandboxes/{id}/code/stream"),
            Some(body),
        )
        .map_err(|e| not_found(e, id))?;
    for ev in events {
        let ev = ev?;
        match ev.name.as_str() {
            "stdout" | "stderr" => {
                write_chunk(ev.name == "stderr", ev.data["data"].as_str().unwrap_or(""))
            }
            "result" => {
                if let Some(text) = ev.data["data"]["text/plain"].as_str() {
                    write_chunk(false, &with_newline(text));
                }
            }
            "error" => {
                if let Some(text) = error_text(&ev.data) {
                    write_chunk(true, &with_newline(&text));
                }
                error = ev.data;
            }
            "done" => {
                let mut done = ev.data;
                if done["error"].is_null() {
                    done["error"] = error;
                }
                return Ok(done);
            }
            "failed" => return Err(not_found(event_error(&ev.data), id)),
            _ => {}
        }
    }
    bail!("the daemon closed the code stream before the run ended")
}

fn with_newline(s: &str) -> String {
    if s.ends_with('\n') {
        s.to_string()
    } else {
        format!("{s}\n")
    }
}

/// What stderr shows for the cell's exception, as `python3 FILE` would: the
/// traceback; for `sys.exit("message")` the message and for an integer
/// `sys.exit` nothing; for a dead interpreter what happened to it.
pub fn error_text(err: &Value) -> Option<String> {
    let name = err["name"].as_str().unwrap_or("");
    let value = err["value"].as_str().unwrap_or("");
    match name {
        "SystemExit" if value == "None" || value.parse::<i64>().is_ok() => None,
        "SystemExit" => Some(value.to_string()),
        _ => match err["traceback"].as_str().filter(|t| !t.is_empty()) {
            Some(tb) => Some(tb.to_string()),
            None => Some(format!("{name}: {value}")),
        },
    }
}

/// The exit status `python3 FILE` would have had for the cell's exception:
/// 1 for an exception, sys.exit's own status, and for an interpreter that
/// died, its status (128+N for signal N), at least 1.
pub fn error_status(err: &Value) -> i32 {
    let value = err["value"].as_str().unwrap_or("");
    match err["name"].as_str().unwrap_or("") {
        "SystemExit" if value == "None" => 0,
        "SystemExit" => value.parse::<i64>().map(|c| (c & 0xff) as i32).unwrap_or(1),
        "InterpreterDied" => {
            let num = |after: &str| {
                value
                    .split(after)
                    .nth(1)
                    .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
                    .and_then(|n| n.parse::<i32>().ok())
            };
            // A dead interpreter is never a success, whatever it said.
            match (num("killed by signal "), num("exited with status ")) {
                (Some(sig), _) => 128 + sig,
                (None, Some(c @ 1..=255)) => c,
                _ => 1,
            }
        }
        _ => 1,
    }
}

/// Our exit status for a code run's summary, with a note on stderr when it
/// was stopped: 124 timeout; 137 for a CPU limit, output cap or OOM (the
/// interpreter was killed, as exec reports it); else the error's status.
pub fn code_status(done: &Value, notes: bool) -> i32 {
    if notes {
        for n in stop_notes(done) {
            eprintln!("hatchery: {n}");
        }
    }
    match done["reason"].as_str().unwrap_or("exited") {
        "timeout" => EXIT_TIMEOUT,
        "cpu_limit" | "output_limit" | "oom" => 128 + libc::SIGKILL,
        "cancelled" => EXIT_HATCHERY,
        _ => match &done["error"] {
            Value::Null => 0,
            err => error_status(err),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(name: &str, value: &str, tb: &str) -> Value {
        json!({"name": name, "value": value, "traceback": tb})
    }

    #[test]
    fn exceptions_map_like_python3() {
        let zde = err(
            "ZeroDivisionError",
            "division by zero",
            "Traceback (most recent call last):\n  File \"<cell-1>\", line 1, in <module>\nZeroDivisionError: division by zero\n",
        );
        assert_eq!(error_status(&zde), 1);
        assert!(error_text(&zde).unwrap().starts_with("Traceback"));
        assert_eq!(error_status(&err("SystemExit", "3", "tb")), 3);
        assert_eq!(error_text(&err("SystemExit", "3", "tb")), None);
        assert_eq!(error_status(&err("SystemExit", "None", "tb")), 0);
        assert_eq!(error_status(&err("SystemExit", "bye", "tb")), 1);
        assert_eq!(error_text(&err("SystemExit", "bye", "tb")).unwrap(), "bye");
        let died = |v: &str| err("InterpreterDied", v, "");
        assert_eq!(
            error_status(&died(
                "the interpreter killed by signal 9; the context was restarted"
            )),
            137
        );
        assert_eq!(
            error_status(&died(
                "the interpreter exited with status 3; the context was restarted"
            )),
            3
        );
        assert_eq!(
            error_status(&died("the interpreter exited with status 0")),
            1
        );
        assert!(error_text(&died("the interpreter exited with status 3"))
            .unwrap()
            .starts_with("InterpreterDied: "));
    }

    #[test]
    fn summaries() {
        assert_eq!(
            code_status(&json!({"reason": "exited", "error": null}), false),
            0
        );
        let raised = json!({"reason": "exited", "error": err("KeyError", "'x'", "tb")});
        assert_eq!(code_status(&raised, false), 1);
        assert_eq!(
            code_status(&json!({"reason": "timeout"}), false),
            EXIT_TIMEOUT
        );
        assert_eq!(code_status(&json!({"reason": "cpu_limit"}), false), 137);
        assert_eq!(code_status(&json!({"reason": "output_limit"}), false), 137);
    }
}
