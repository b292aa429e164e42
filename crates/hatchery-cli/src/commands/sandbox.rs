//! `hatchery sandbox create|ls|get|kill|ttl`.

use crate::client::{api_code, Api};
use crate::output::{self, kv_map, metadata_query, s};
use anyhow::bail;
use clap::Subcommand;
use serde_json::{json, Value};

#[derive(Subcommand)]
pub enum SandboxCmd {
    /// Create a sandbox; prints its id (or the whole object with --json).
    Create {
        /// Template to start from.
        #[arg(long, default_value = "code-interpreter")]
        template: String,
        /// Seconds until the sandbox is destroyed (daemon default: 300).
        #[arg(long)]
        ttl: Option<u64>,
        /// KEY=VALUE, repeatable.
        #[arg(long = "metadata", short = 'm', value_name = "KEY=VALUE")]
        metadata: Vec<String>,
        /// KEY=VALUE applied to every exec, repeatable.
        #[arg(long = "env", short = 'e', value_name = "KEY=VALUE")]
        env: Vec<String>,
        /// Network policy: JSON text or @FILE (see `hatchery network set`).
        #[arg(long, value_name = "JSON|@FILE")]
        network: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// List live sandboxes, oldest first.
    Ls {
        /// Only sandboxes with this metadata (KEY=VALUE, repeatable; all must match).
        #[arg(long = "metadata", short = 'm', value_name = "KEY=VALUE")]
        metadata: Vec<String>,
        #[arg(long)]
        json: bool,
    },
    /// Show one sandbox.
    Get {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Destroy sandboxes (by id, or every one matching --all [--metadata]).
    #[command(alias = "rm")]
    Kill {
        #[arg(required_unless_present = "all")]
        ids: Vec<String>,
        /// Every live sandbox (narrowed by --metadata).
        #[arg(long, conflicts_with = "ids")]
        all: bool,
        #[arg(
            long = "metadata",
            short = 'm',
            value_name = "KEY=VALUE",
            requires = "all"
        )]
        metadata: Vec<String>,
    },
    /// Set a sandbox's time to live, counted from now; prints the new expiry.
    Ttl {
        id: String,
        seconds: u64,
        #[arg(long)]
        json: bool,
    },
}

pub fn run(api: &Api, cmd: SandboxCmd) -> anyhow::Result<i32> {
    match cmd {
        SandboxCmd::Create {
            template,
            ttl,
            metadata,
            env,
            network,
            json,
        } => {
            let mut body = json!({
                "template": template,
                "metadata": kv_map(&metadata, "--metadata")?,
                "env": kv_map(&env, "--env")?,
            });
            if let Some(t) = ttl {
                body["ttl_seconds"] = t.into();
            }
            if let Some(n) = network {
                body["network"] = super::network::policy_arg(&n)?;
            }
            let sbx = api.send("POST", "/v1/sandboxes", &body)?;
            output::show(json, &sbx, |v| println!("{}", s(&v["id"])));
        }
        SandboxCmd::Ls { metadata, json } => {
            let list = api.get(&format!("/v1/sandboxes{}", metadata_query(&metadata)?))?;
            output::show(json, &list["sandboxes"], print_table);
        }
        SandboxCmd::Get { id, json } => {
            let sbx = get(api, &id)?;
            if json {
                output::json(&sbx);
            } else {
                for k in ["id", "template", "state", "created_at", "expires_at"] {
                    println!("{:<11} {}", format!("{k}:"), s(&sbx[k]));
                }
                println!(
                    "{:<11} {}",
                    "expires in:",
                    output::until(&sbx["expires_at"])
                );
                println!("{:<11} {}", "metadata:", output::pairs(&sbx["metadata"]));
            }
        }
        SandboxCmd::Kill { ids, all, metadata } => {
            if !all && !metadata.is_empty() {
                bail!("--metadata selects sandboxes only together with --all");
            }
            let ids = if all {
                let list = api.get(&format!("/v1/sandboxes{}", metadata_query(&metadata)?))?;
                list["sandboxes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|v| s(&v["id"]))
                    .collect()
            } else {
                ids
            };
            // Delete answers 204 for anything; look first so a typo is an error.
            let mut missing = Vec::new();
            for id in &ids {
                if let Err(e) = check_id(id, "sbx_") {
                    eprintln!("hatchery: {e}");
                    missing.push(id.clone());
                    continue;
                }
                match api.get(&format!("/v1/sandboxes/{id}")) {
                    Ok(_) => {
                        api.delete(&format!("/v1/sandboxes/{id}"))?;
                        println!("{id}");
                    }
                    Err(e) if api_code(&e) == Some("sandbox_not_found") => {
                        eprintln!("hatchery: {}", not_found(e, id));
                        missing.push(id.clone());
                    }
                    Err(e) => return Err(e),
                }
            }
            if !missing.is_empty() {
                return Ok(1);
            }
        }
        SandboxCmd::Ttl { id, seconds, json } => {
            check_id(&id, "sbx_")?;
            let sbx = api
                .send(
                    "PATCH",
                    &format!("/v1/sandboxes/{id}"),
                    &json!({ "ttl_seconds": seconds }),
                )
                .map_err(|e| not_found(e, &id))?;
            output::show(json, &sbx, |v| println!("{}", s(&v["expires_at"])));
        }
    }
    Ok(0)
}

/// GET a sandbox, with a plain message when it does not exist.
pub fn get(api: &Api, id: &str) -> anyhow::Result<Value> {
    check_id(id, "sbx_")?;
    api.get(&format!("/v1/sandboxes/{id}"))
        .map_err(|e| not_found(e, id))
}

pub fn not_found(e: anyhow::Error, id: &str) -> anyhow::Error {
    match api_code(&e) {
        Some("sandbox_not_found") => anyhow::anyhow!(
            "no sandbox {id}: it does not exist or has already stopped (see `hatchery sandbox ls`)"
        ),
        _ => e,
    }
}

/// Catches an id of the wrong kind (a snapshot id given to `exec`, say)
/// before the daemon answers a vaguer 404.
pub fn check_id(id: &str, prefix: &str) -> anyhow::Result<()> {
    if !id.starts_with(prefix) {
        let kind = match prefix {
            "sbx_" => "sandbox",
            "proc_" => "process",
            _ => "snapshot",
        };
        bail!("{id:?} is not a {kind} id (those start with {prefix})");
    }
    Ok(())
}

fn print_table(list: &Value) {
    let rows: Vec<Vec<String>> = list
        .as_array()
        .into_iter()
        .flatten()
        .map(|x| {
            vec![
                s(&x["id"]),
                s(&x["template"]),
                s(&x["state"]),
                output::when(&x["created_at"]),
                output::until(&x["expires_at"]),
                output::pairs(&x["metadata"]),
            ]
        })
        .collect();
    output::table(
        &[
            "ID",
            "TEMPLATE",
            "STATE",
            "CREATED",
            "EXPIRES IN",
            "METADATA",
        ],
        &rows,
    );
}
