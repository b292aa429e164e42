//! `hatchery env create|build|ls|get|rm`: environments (`/v1/environments`),
//! a repository's set-up done once for the sessions that start from it.

use crate::client::{event_error, Api};
use crate::commands::template::bar;
use crate::output::{self, s, table, when};
use anyhow::{bail, Context};
use clap::Subcommand;
use serde_json::{json, Value};

#[derive(Subcommand)]
pub enum EnvCmd {
    /// Create an environment (build it next); prints its id.
    Create {
        #[arg(long)]
        name: String,
        #[arg(long)]
        repo: String,
        /// The base ref the set-up runs on (default main).
        #[arg(long = "ref")]
        git_ref: Option<String>,
        #[arg(long)]
        template: Option<String>,
        /// The set-up script, run in the checkout (`/bin/sh -c`).
        #[arg(long, default_value = "")]
        setup: String,
        /// A NetworkPolicy allow rule (JSON) the set-up may use,
        /// repeatable: `--allow '{"cidr":"10.0.0.5","ports":[443]}'`.
        #[arg(long = "allow", value_name = "RULE_JSON")]
        allow: Vec<String>,
        /// Seconds the set-up may take (default 600, at most 3600).
        #[arg(long)]
        setup_timeout: Option<u64>,
        /// Sandboxes of the current version kept restored while the
        /// environment is hot, so a session claims one (0..8, default 2;
        /// 0: no pool).
        #[arg(long)]
        pool_size: Option<u64>,
        #[arg(long)]
        json: bool,
    },
    /// Build a new version, with a progress bar; prints the version.
    Build { id: String },
    /// List environments.
    #[command(alias = "list")]
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Show one environment.
    Get {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Delete an environment and its snapshots (refused while sessions
    /// use it).
    #[command(alias = "delete")]
    Rm { id: String },
}

pub fn run(api: &Api, cmd: EnvCmd) -> anyhow::Result<i32> {
    match cmd {
        EnvCmd::Create {
            name,
            repo,
            git_ref,
            template,
            setup,
            allow,
            setup_timeout,
            pool_size,
            json,
        } => {
            let rules = allow
                .iter()
                .map(|r| serde_json::from_str::<Value>(r).with_context(|| format!("--allow {r}")))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let mut body =
                json!({"name": name, "repo": repo, "setup": setup, "setup_allow": rules});
            if let Some(r) = git_ref {
                body["ref"] = r.into();
            }
            if let Some(t) = template {
                body["template"] = t.into();
            }
            if let Some(t) = setup_timeout {
                body["setup_timeout_s"] = t.into();
            }
            if let Some(n) = pool_size {
                body["pool_size"] = n.into();
            }
            let r = api.send("POST", "/v1/environments", &body)?;
            output::show(json, &r, |v| println!("{}", s(&v["environment_id"])));
        }
        EnvCmd::Build { id } => build(api, &id)?,
        EnvCmd::Ls { json } => {
            let r = api.get("/v1/environments")?;
            output::show(json, &r["environments"], |v| {
                let rows: Vec<Vec<String>> = v
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|x| {
                        vec![
                            s(&x["environment_id"]),
                            s(&x["name"]),
                            x["current"]["version"]
                                .as_u64()
                                .map_or("-".into(), |v| v.to_string()),
                            when(&x["created_at"]),
                            s(&x["repo"]),
                        ]
                    })
                    .collect();
                table(&["ID", "NAME", "VERSION", "CREATED", "REPO"], &rows);
            });
        }
        EnvCmd::Get { id, json } => {
            let r = api.get(&format!("/v1/environments/{}", enc(&id)))?;
            output::show(json, &r, |v| {
                println!("{}", serde_json::to_string_pretty(v).unwrap_or_default())
            });
        }
        EnvCmd::Rm { id } => api.delete(&format!("/v1/environments/{}", enc(&id)))?,
    }
    Ok(0)
}

fn enc(id: &str) -> String {
    hatchery_client::encode_component(id)
}

/// POST :build and follow its events with a progress bar on stderr.
fn build(api: &Api, id: &str) -> anyhow::Result<()> {
    let (mut step, mut percent) = ("starting".to_string(), 0u64);
    let path = format!("/v1/environments/{}:build", enc(id));
    for ev in api.events("POST", &path, None)? {
        let ev = ev?;
        match ev.name.as_str() {
            "step" => {
                step = s(&ev.data["step"]);
                percent = ev.data["percent"].as_u64().unwrap_or(percent);
            }
            "done" => {
                bar("done", 100);
                eprintln!();
                println!("{}", ev.data["version"]);
                return Ok(());
            }
            "error" => {
                eprintln!();
                bail!("build failed: {:#}", event_error(&ev.data));
            }
            _ => {}
        }
        bar(&step, percent);
    }
    eprintln!();
    bail!("the event stream ended before the build did")
}
