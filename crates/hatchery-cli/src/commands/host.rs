//! `hatchery host ls|get|cordon|uncordon|drain`: the hosts sharing the
//! daemon's state store (`GET /v1/hosts`), and the operator's holds.

use crate::client::{api_code, Api};
use crate::output::{self, s};
use clap::Subcommand;
use serde_json::Value;

#[derive(Subcommand)]
pub enum HostCmd {
    /// List the hosts with their state and load.
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Show one host.
    Get {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Place nothing new on a host; its sandboxes keep being served.
    Cordon {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// End a cordon or a drain.
    Uncordon {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Stop placement on a host and move its sessions to other hosts
    /// (`hatchery host get ID` shows them falling to 0; then stop it).
    Drain {
        id: String,
        #[arg(long)]
        json: bool,
    },
}

pub fn run(api: &Api, cmd: HostCmd) -> anyhow::Result<i32> {
    let (verb, id, json) = match cmd {
        HostCmd::Ls { json } => {
            let list = api.get("/v1/hosts")?;
            output::show(json, &list["hosts"], print_table);
            return Ok(0);
        }
        HostCmd::Get { id, json } => {
            check_id(&id)?;
            let h = api
                .get(&format!("/v1/hosts/{id}"))
                .map_err(|e| not_found(e, &id))?;
            output::show(json, &h, print_one);
            return Ok(0);
        }
        HostCmd::Cordon { id, json } => ("cordon", id, json),
        HostCmd::Uncordon { id, json } => ("uncordon", id, json),
        HostCmd::Drain { id, json } => ("drain", id, json),
    };
    check_id(&id)?;
    let h = api
        .call("POST", &format!("/v1/hosts/{id}:{verb}"))
        .map_err(|e| not_found(e, &id))?;
    output::show(json, &h, |h| println!("{} {}", s(&h["id"]), s(&h["state"])));
    Ok(0)
}

/// Refused here, before a request: what the daemon would refuse anyway.
fn check_id(id: &str) -> anyhow::Result<()> {
    let ok = (1..=64).contains(&id.len())
        && !id.starts_with('-')
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !ok {
        anyhow::bail!("{id:?} is not a host id (1 to 64 of a-z, 0-9 and '-')");
    }
    Ok(())
}

fn not_found(e: anyhow::Error, id: &str) -> anyhow::Error {
    if api_code(&e) == Some("host_not_found") {
        return anyhow::anyhow!("no host {id} (`hatchery host ls` lists them)");
    }
    e
}

fn age(v: &Value) -> String {
    match v.as_u64() {
        Some(ms) => format!("{:.1}s", ms as f64 / 1000.0),
        None => String::new(),
    }
}

/// The state, and `(stopping)` while the host moves its sessions away
/// after a SIGTERM (shown `draining` whatever the operator's hold).
fn state(h: &Value) -> String {
    match h["stopping"].as_bool() {
        Some(true) => format!("{} (stopping)", s(&h["state"])),
        _ => s(&h["state"]),
    }
}

fn print_table(list: &Value) {
    let rows: Vec<Vec<String>> = list
        .as_array()
        .into_iter()
        .flatten()
        .map(|h| {
            vec![
                s(&h["id"]),
                state(h),
                s(&h["address"]),
                format!("{}/{}", s(&h["live_sandboxes"]), s(&h["capacity"])),
                s(&h["live_sessions"]),
                age(&h["heartbeat_age_ms"]),
                s(&h["version"]),
            ]
        })
        .collect();
    output::table(
        &[
            "ID",
            "STATE",
            "ADDRESS",
            "SANDBOXES",
            "SESSIONS",
            "HEARTBEAT",
            "VERSION",
        ],
        &rows,
    );
}

fn print_one(h: &Value) {
    println!("{:<11} {}", "id:", s(&h["id"]));
    println!("{:<11} {}", "state:", state(h));
    for k in ["address", "version"] {
        println!("{:<11} {}", format!("{k}:"), s(&h[k]));
    }
    println!(
        "{:<11} {}/{}",
        "sandboxes:",
        s(&h["live_sandboxes"]),
        s(&h["capacity"])
    );
    println!("{:<11} {}", "sessions:", s(&h["live_sessions"]));
    println!("{:<11} {} ago", "heartbeat:", age(&h["heartbeat_age_ms"]));
}
