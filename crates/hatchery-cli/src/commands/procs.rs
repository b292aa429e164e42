//! Background processes (`hatchery exec --background` starts them): `ps`
//! lists a sandbox's, `attach` streams one's output (and feeds its stdin),
//! `wait` waits for its end, `kill` ends it or signals it.

use crate::client::{api_code, event_error, Api, EXIT_TIMEOUT};
use crate::commands::exec::stop_notes;
use crate::commands::sandbox::{self, check_id};
use crate::output::{self, s};
use anyhow::{bail, Context};
use base64::Engine;
use clap::Args;
use serde_json::{json, Value};
use std::io::{IsTerminal, Read, Write};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct PsArgs {
    /// Sandbox id.
    pub id: String,
    /// Print the processes as a JSON array of ProcessInfo objects.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct AttachArgs {
    /// Sandbox id.
    pub id: String,
    /// Process id (`proc_…`, from `exec --background` or `ps`).
    pub proc: String,
    /// Replay all the output still kept (the last 1 MiB) before following.
    #[arg(long, conflicts_with = "offset")]
    pub from_start: bool,
    /// Start at this output offset (stdout and stderr share one offset
    /// space). Default: the output's current end, so only new output shows.
    #[arg(long, value_name = "N")]
    pub offset: Option<u64>,
    /// Print the output there is now and return instead of following it.
    #[arg(long)]
    pub no_follow: bool,
    /// Forward our stdin to the process's stdin, and close it at our EOF
    /// (the default when our stdin is not a terminal).
    #[arg(long, short = 'i', conflicts_with = "no_stdin")]
    pub stdin: bool,
    /// Never forward our stdin, even when it is not a terminal.
    #[arg(long)]
    pub no_stdin: bool,
}

#[derive(Args)]
pub struct KillArgs {
    /// Sandbox id.
    pub id: String,
    /// Process id (`proc_…`).
    pub proc: String,
    /// Send this signal (TERM, SIGTERM, 15; HUP INT QUIT KILL USR1 USR2
    /// TERM CONT STOP WINCH) to the process's group instead of killing
    /// everything it started.
    #[arg(long, short = 's', value_name = "SIGNAL")]
    pub signal: Option<String>,
    /// Print the process's ProcessInfo as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct WaitArgs {
    /// Sandbox id.
    pub id: String,
    /// Process id (`proc_…`).
    pub proc: String,
    /// Give up after this many seconds (status 124); default: wait forever.
    #[arg(long, short = 't', value_name = "SECONDS")]
    pub timeout: Option<u64>,
    /// Print the process's ProcessInfo as JSON.
    #[arg(long)]
    pub json: bool,
}

fn path(id: &str, proc: &str) -> String {
    format!("/v1/sandboxes/{id}/processes/{proc}")
}

fn check(id: &str, proc: &str) -> anyhow::Result<()> {
    check_id(id, "sbx_")?;
    check_id(proc, "proc_")
}

/// Plain messages for an unknown sandbox or process.
fn not_found(e: anyhow::Error, id: &str, proc: &str) -> anyhow::Error {
    match api_code(&e) {
        Some("process_not_found") => anyhow::anyhow!(
            "no process {proc} in sandbox {id}: process ids name a process in one sandbox only, \
             and only the last 64 that exited are kept (see `hatchery ps {id}`)"
        ),
        _ => sandbox::not_found(e, id),
    }
}

fn get(api: &Api, id: &str, proc: &str) -> anyhow::Result<Value> {
    check(id, proc)?;
    api.get(&path(id, proc)).map_err(|e| not_found(e, id, proc))
}

/// Our exit status for an exited process: its exit code, 128+N for signal N.
pub fn exit_status(info: &Value) -> i32 {
    match (info["exit_code"].as_i64(), info["signal"].as_i64()) {
        (Some(c @ 0..=255), _) => c as i32,
        (_, Some(n @ 1..=127)) => 128 + n as i32,
        _ => 255,
    }
}

fn exit_note(info: &Value) -> String {
    match (info["exit_code"].as_i64(), info["signal"].as_i64()) {
        (_, Some(n)) if n > 0 => format!("signal {n}"),
        (Some(c), _) => c.to_string(),
        _ => String::new(),
    }
}

/// argv for people: words with spaces or quotes are single-quoted.
fn command_line(argv: &Value) -> String {
    argv.as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            let a = s(a);
            if !a.is_empty()
                && a.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,@%+".contains(&b))
            {
                a
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

pub fn ps(api: &Api, a: PsArgs) -> anyhow::Result<i32> {
    check_id(&a.id, "sbx_")?;
    let v = api
        .get(&format!("/v1/sandboxes/{}/processes", a.id))
        .map_err(|e| sandbox::not_found(e, &a.id))?;
    let list = v["processes"].clone();
    output::show(a.json, &list, |list| {
        let rows: Vec<Vec<String>> = list
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                vec![
                    s(&p["id"]),
                    s(&p["pid"]),
                    s(&p["state"]),
                    exit_note(p),
                    s(&p["cpu_ms"]),
                    output::when(&p["started_at"]),
                    command_line(&p["argv"]),
                ]
            })
            .collect();
        output::table(
            &["ID", "PID", "STATE", "EXIT", "CPU ms", "STARTED", "COMMAND"],
            &rows,
        );
    });
    Ok(0)
}

pub fn kill(api: &Api, a: KillArgs) -> anyhow::Result<i32> {
    check(&a.id, &a.proc)?;
    let info = match &a.signal {
        None => api.call("DELETE", &path(&a.id, &a.proc)),
        Some(sig) => api.send(
            "POST",
            &format!("{}/signal", path(&a.id, &a.proc)),
            &json!({ "signal": sig }),
        ),
    }
    .map_err(|e| match (&a.signal, api_code(&e)) {
        (Some(sig), Some("invalid_request")) => anyhow::anyhow!(
            "--signal {sig}: {e}. Give a name (TERM or SIGTERM) or number of HUP INT QUIT KILL \
             USR1 USR2 TERM CONT STOP WINCH"
        ),
        _ => not_found(e, &a.id, &a.proc),
    })?;
    output::show(a.json, &info, |v| println!("{}", s(&v["id"])));
    Ok(0)
}

pub fn wait(api: &Api, a: WaitArgs) -> anyhow::Result<i32> {
    check(&a.id, &a.proc)?;
    let deadline = a.timeout.map(|t| Instant::now() + Duration::from_secs(t));
    loop {
        // The daemon waits at most 300 s per request; longer waits repeat it.
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        let secs = match left {
            Some(l) => (l.as_millis().div_ceil(1000) as u64).min(300),
            None => 300,
        };
        let info = if secs == 0 {
            get(api, &a.id, &a.proc)?
        } else {
            api.call(
                "POST",
                &format!("{}/wait?timeout_seconds={secs}", path(&a.id, &a.proc)),
            )
            .map_err(|e| not_found(e, &a.id, &a.proc))?
        };
        let running = info["state"] == "running";
        let out_of_time = secs == 0 || deadline.is_some_and(|d| Instant::now() >= d);
        if running && !out_of_time {
            continue;
        }
        output::show(a.json, &info, |_| {});
        if running {
            if !a.json {
                eprintln!(
                    "hatchery: {} is still running after {} s (exit {EXIT_TIMEOUT})",
                    a.proc,
                    a.timeout.unwrap_or(0)
                );
            }
            return Ok(EXIT_TIMEOUT);
        }
        if !a.json {
            for n in stop_notes(&info) {
                eprintln!("hatchery: {n}");
            }
        }
        return Ok(exit_status(&info));
    }
}

/// What the Ctrl-C handler writes: built before it is installed.
static DETACH_NOTE: OnceLock<Vec<u8>> = OnceLock::new();

extern "C" fn on_interrupt(_: libc::c_int) {
    // Only async-signal-safe calls here: write(2) and _exit(2).
    if let Some(note) = DETACH_NOTE.get() {
        // SAFETY: the buffer lives for the whole program (a static); write
        // reads at most its length.
        unsafe {
            libc::write(2, note.as_ptr().cast(), note.len());
        }
    }
    // SAFETY: _exit ends the process at once, without running anything else.
    unsafe { libc::_exit(130) }
}

pub fn attach(api: &Api, a: AttachArgs) -> anyhow::Result<i32> {
    let info = get(api, &a.id, &a.proc)?;
    let offset = if a.from_start {
        let first = info["first_offset"].as_u64().unwrap_or(0);
        if first > 0 {
            eprintln!(
                "hatchery: the first {first} bytes of output are no longer kept (the last 1 MiB is)"
            );
        }
        0
    } else {
        a.offset
            .unwrap_or_else(|| info["output_bytes"].as_u64().unwrap_or(0))
    };
    let forward =
        !a.no_stdin && (a.stdin || !std::io::stdin().is_terminal()) && info["stdin_open"] == true;
    if a.stdin && info["stdin_open"] != true {
        eprintln!(
            "hatchery: {}'s stdin is already closed; not forwarding ours",
            a.proc
        );
    }
    if forward {
        let (api, id, proc) = (api.clone(), a.id.clone(), a.proc.clone());
        std::thread::spawn(move || {
            if let Err(e) = forward_stdin(&api, &id, &proc) {
                eprintln!("hatchery: stdin: {e:#}");
            }
        });
    }
    let _ = DETACH_NOTE.set(
        format!(
            "\nhatchery: detached; {proc} keeps running (`hatchery attach {id} {proc}` again, \
             `hatchery kill {id} {proc}` to end it)\n",
            id = a.id,
            proc = a.proc
        )
        .into_bytes(),
    );
    // SAFETY: installs a handler that only calls async-signal-safe functions.
    unsafe {
        libc::signal(
            libc::SIGINT,
            on_interrupt as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
    }
    let events = api
        .events(
            "GET",
            &format!(
                "{}/output?offset={offset}&follow={}&encoding=base64",
                path(&a.id, &a.proc),
                !a.no_follow
            ),
            None,
        )
        .map_err(|e| not_found(e, &a.id, &a.proc))?;
    let b64 = base64::engine::general_purpose::STANDARD;
    for ev in events {
        let ev = ev?;
        match ev.name.as_str() {
            "stdout" | "stderr" => {
                let bytes = b64
                    .decode(ev.data["data"].as_str().unwrap_or(""))
                    .context("the daemon sent output that is not base64")?;
                // A closed pipe (`| head`) is not worth a panic.
                let _ = if ev.name == "stderr" {
                    let mut e = std::io::stderr().lock();
                    e.write_all(&bytes).and_then(|_| e.flush())
                } else {
                    let mut o = std::io::stdout().lock();
                    o.write_all(&bytes).and_then(|_| o.flush())
                };
            }
            "exit" => {
                for n in stop_notes(&ev.data) {
                    eprintln!("hatchery: {n}");
                }
                return Ok(exit_status(&ev.data));
            }
            "end" => return Ok(0),
            "error" => return Err(not_found(event_error(&ev.data), &a.id, &a.proc)),
            _ => {}
        }
    }
    bail!("the daemon closed the output stream before the process ended")
}

/// Copies our stdin to the process's, chunk by chunk as it arrives, and
/// closes the process's stdin at our EOF.
fn forward_stdin(api: &Api, id: &str, proc: &str) -> anyhow::Result<()> {
    let mut stdin = std::io::stdin().lock();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match stdin.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        if n == 0 {
            break;
        }
        loop {
            let chunk = bytes::Bytes::copy_from_slice(&buf[..n]);
            match api.run(api.c()?.write_stdin(id, proc, chunk)) {
                Ok(()) => break,
                // Over 4 MiB queued that the process has not read yet.
                Err(e) if api_code(&e) == Some("too_many") || is_status(&e, 429) => {
                    std::thread::sleep(Duration::from_millis(100))
                }
                // It closed its stdin or ended: nothing more to send.
                Err(e) if is_status(&e, 409) || is_status(&e, 404) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }
    match api.run(api.c()?.close_stdin(id, proc)) {
        Err(e) if is_status(&e, 409) || is_status(&e, 404) => Ok(()),
        r => r.map(drop),
    }
}

fn is_status(e: &anyhow::Error, status: u16) -> bool {
    e.downcast_ref::<crate::client::ApiError>()
        .is_some_and(|a| a.status == status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_command_lines() {
        assert_eq!(exit_status(&json!({"exit_code": 3, "signal": null})), 3);
        assert_eq!(exit_status(&json!({"exit_code": null, "signal": 15})), 143);
        assert_eq!(
            exit_note(&json!({"exit_code": 143, "signal": 15})),
            "signal 15"
        );
        assert_eq!(exit_note(&json!({"exit_code": null, "signal": null})), "");
        assert_eq!(
            command_line(&json!(["/bin/sh", "-c", "echo 'hi' $X"])),
            r"/bin/sh -c 'echo '\''hi'\'' $X'"
        );
    }
}
