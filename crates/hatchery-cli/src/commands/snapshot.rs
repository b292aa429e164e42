//! `hatchery snapshot create|ls|get|fork|rm`.

use crate::client::{api_code, Api};
use crate::commands::sandbox::{check_id, not_found};
use crate::output::{self, kv_map, metadata_query, s};
use clap::Subcommand;
use serde_json::{json, Value};

#[derive(Subcommand)]
pub enum SnapshotCmd {
    /// Snapshot a running sandbox (it keeps running); prints the snapshot id.
    Create {
        sandbox: String,
        /// Seconds to keep the snapshot (daemon default 7 days).
        #[arg(long)]
        retention: Option<u64>,
        #[arg(long = "metadata", short = 'm', value_name = "KEY=VALUE")]
        metadata: Vec<String>,
        #[arg(long)]
        json: bool,
    },
    /// List snapshots, oldest first.
    Ls {
        #[arg(long = "metadata", short = 'm', value_name = "KEY=VALUE")]
        metadata: Vec<String>,
        #[arg(long)]
        json: bool,
    },
    /// Show one snapshot.
    Get {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// New sandboxes from a snapshot; prints their ids, one a line.
    Fork {
        id: String,
        /// How many sandboxes (1..16).
        #[arg(long, short = 'n', default_value_t = 1)]
        count: u32,
        #[arg(long)]
        ttl: Option<u64>,
        #[arg(long = "metadata", short = 'm', value_name = "KEY=VALUE")]
        metadata: Vec<String>,
        /// Network policy of the forks: JSON text or @FILE.
        #[arg(long, value_name = "JSON|@FILE")]
        network: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Delete snapshots.
    #[command(alias = "delete")]
    Rm {
        #[arg(required = true)]
        ids: Vec<String>,
    },
}

pub fn run(api: &Api, cmd: SnapshotCmd) -> anyhow::Result<i32> {
    match cmd {
        SnapshotCmd::Create {
            sandbox,
            retention,
            metadata,
            json,
        } => {
            check_id(&sandbox, "sbx_")?;
            let mut body = json!({ "metadata": kv_map(&metadata, "--metadata")? });
            if let Some(r) = retention {
                body["retention_seconds"] = r.into();
            }
            let snap = api
                .send("POST", &format!("/v1/sandboxes/{sandbox}/snapshots"), &body)
                .map_err(|e| not_found(e, &sandbox))?;
            output::show(json, &snap, |v| println!("{}", s(&v["id"])));
        }
        SnapshotCmd::Ls { metadata, json } => {
            let list = api.get(&format!("/v1/snapshots{}", metadata_query(&metadata)?))?;
            output::show(json, &list["snapshots"], print_table);
        }
        SnapshotCmd::Get { id, json } => {
            let snap = get(api, &id)?;
            if json {
                output::json(&snap);
            } else {
                for k in ["id", "sandbox_id", "template", "created_at", "expires_at"] {
                    println!("{:<11} {}", format!("{k}:"), s(&snap[k]));
                }
                println!("{:<11} {}", "size:", output::bytes(&snap["size_bytes"]));
                println!("{:<11} {}", "metadata:", output::pairs(&snap["metadata"]));
            }
        }
        SnapshotCmd::Fork {
            id,
            count,
            ttl,
            metadata,
            network,
            json,
        } => {
            check_id(&id, "snap_")?;
            let mut body = json!({ "count": count, "metadata": kv_map(&metadata, "--metadata")? });
            if let Some(t) = ttl {
                body["ttl_seconds"] = t.into();
            }
            if let Some(n) = network {
                body["network"] = super::network::policy_arg(&n)?;
            }
            let out = api
                .send("POST", &format!("/v1/snapshots/{id}/fork"), &body)
                .map_err(|e| snap_not_found(e, &id))?;
            if json {
                output::json(&out["sandboxes"]);
            } else {
                for sbx in out["sandboxes"].as_array().into_iter().flatten() {
                    println!("{}", s(&sbx["id"]));
                }
            }
        }
        SnapshotCmd::Rm { ids } => {
            let mut missing = false;
            for id in &ids {
                // Delete answers 204 for anything; look first so a typo is an error.
                if let Err(e) = check_id(id, "snap_") {
                    eprintln!("hatchery: {e}");
                    missing = true;
                    continue;
                }
                match api.get(&format!("/v1/snapshots/{id}")) {
                    Ok(_) => {
                        api.delete(&format!("/v1/snapshots/{id}"))?;
                        println!("{id}");
                    }
                    Err(e) if api_code(&e) == Some("snapshot_not_found") => {
                        eprintln!("hatchery: {}", snap_not_found(e, id));
                        missing = true;
                    }
                    Err(e) => return Err(e),
                }
            }
            if missing {
                return Ok(1);
            }
        }
    }
    Ok(0)
}

fn get(api: &Api, id: &str) -> anyhow::Result<Value> {
    check_id(id, "snap_")?;
    api.get(&format!("/v1/snapshots/{id}"))
        .map_err(|e| snap_not_found(e, id))
}

fn snap_not_found(e: anyhow::Error, id: &str) -> anyhow::Error {
    match api_code(&e) {
        Some("snapshot_not_found") => anyhow::anyhow!(
            "no snapshot {id}: it does not exist, was deleted or expired (see `hatchery snapshot ls`)"
        ),
        _ => e,
    }
}

fn print_table(list: &Value) {
    let rows: Vec<Vec<String>> = list
        .as_array()
        .into_iter()
        .flatten()
        .map(|x| {
            vec![
                s(&x["id"]),
                s(&x["sandbox_id"]),
                s(&x["template"]),
                output::when(&x["created_at"]),
                output::bytes(&x["size_bytes"]),
                output::until(&x["expires_at"]),
                output::pairs(&x["metadata"]),
            ]
        })
        .collect();
    output::table(
        &[
            "ID",
            "SANDBOX",
            "TEMPLATE",
            "CREATED",
            "SIZE",
            "EXPIRES IN",
            "METADATA",
        ],
        &rows,
    );
}
