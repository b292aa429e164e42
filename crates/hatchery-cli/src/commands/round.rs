//! `hatchery round create|ls|get|invite|interviewer|report|replay`: interview rounds
//! (docs/interviews.md), through the typed `hatchery-client`.

use crate::client::Api;
use anyhow::Context;
use clap::Subcommand;
use hatchery_client::{encode_component as enc, Client, ClientConfig, Method};
use serde_json::{json, Value};
use std::time::Duration;

#[derive(Subcommand)]
pub enum RoundCmd {
    /// Create a round from a JSON spec (the body of POST /v1/rounds: name,
    /// template, starter_files, tests, cpu_time_limit_ms, ...), `-` for
    /// stdin. Prepares it (setup included) and prints its id.
    Create {
        spec: String,
        #[arg(long)]
        json: bool,
    },
    /// List rounds.
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Show a round and its sessions.
    Get {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Invite a candidate: prints the room link (it carries the
    /// candidate's token: send it to them only).
    Invite {
        id: String,
        candidate: String,
        #[arg(long)]
        json: bool,
    },
    /// An interviewer token for a round: prints the room link (it
    /// carries the token). It opens each session's live room read-only
    /// (typing while pairing is on) and keeps notes; no reports.
    Interviewer {
        id: String,
        /// Lifetime in seconds (default 7 days, at most 90).
        #[arg(long)]
        ttl: Option<u64>,
        #[arg(long)]
        json: bool,
    },
    /// A session's full grading report (assertion text included: for
    /// reviewers, never for the candidate).
    Report {
        id: String,
        session: String,
        #[arg(long)]
        json: bool,
    },
    /// Replays of a session: take one now (default), list them (--list),
    /// or fork one (--fork REPLAY_ID; deny-all egress) and list its files.
    Replay {
        id: String,
        session: String,
        #[arg(long, conflicts_with = "fork")]
        list: bool,
        #[arg(long, value_name = "REPLAY_ID")]
        fork: Option<String>,
        #[arg(long)]
        json: bool,
    },
}

fn client(api: &Api) -> anyhow::Result<Client> {
    // Creating a round runs its setup before answering.
    let cfg = ClientConfig::default().call_timeout(Duration::from_secs(900));
    Ok(Client::with_config(&api.url, &api.key()?, cfg)?)
}

fn print(v: &Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

fn s(v: &Value, k: &str) -> String {
    match &v[k] {
        Value::String(x) => x.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

fn result_text(r: &Value) -> String {
    if r.is_null() {
        return "-".into();
    }
    format!("{}/{}", s(r, "passed"), s(r, "total"))
}

pub async fn run(api: &Api, cmd: RoundCmd) -> anyhow::Result<i32> {
    let c = client(api)?;
    match cmd {
        RoundCmd::Create { spec, json } => {
            let text = if spec == "-" {
                std::io::read_to_string(std::io::stdin())?
            } else {
                std::fs::read_to_string(&spec).with_context(|| format!("reading {spec}"))?
            };
            let body: Value =
                serde_json::from_str(&text).with_context(|| format!("{spec} is not JSON"))?;
            let r = c
                .request_json(Method::POST, "/v1/rounds", Some(&body))
                .await?;
            if json {
                print(&r);
            } else {
                println!("{}", s(&r, "id"));
            }
        }
        RoundCmd::Ls { json } => {
            let r = c.request_json(Method::GET, "/v1/rounds", None).await?;
            if json {
                print(&r);
            } else {
                println!(
                    "{:<22} {:<9} {:<18} {:>7}  NAME",
                    "ID", "STATE", "TEMPLATE", "CPU_MS"
                );
                for x in r["rounds"].as_array().into_iter().flatten() {
                    println!(
                        "{:<22} {:<9} {:<18} {:>7}  {}",
                        s(x, "id"),
                        s(x, "state"),
                        s(x, "template"),
                        s(x, "cpu_time_limit_ms"),
                        s(x, "name")
                    );
                }
            }
        }
        RoundCmd::Get { id, json } => {
            let r = c
                .request_json(Method::GET, &format!("/v1/rounds/{}", enc(&id)), None)
                .await?;
            let ss = c
                .request_json(
                    Method::GET,
                    &format!("/v1/rounds/{}/sessions", enc(&id)),
                    None,
                )
                .await?;
            if json {
                print(&json!({"round": r, "sessions": ss["sessions"]}));
            } else {
                println!("{} {} ({})", s(&r, "id"), s(&r, "name"), s(&r, "state"));
                println!(
                    "template {}@{}  cpu {} ms  wall {} ms  mode {}  retention {} s",
                    s(&r, "template"),
                    s(&r, "template_version"),
                    s(&r, "cpu_time_limit_ms"),
                    s(&r, "wall_time_limit_ms"),
                    s(&r, "run_mode"),
                    s(&r, "retention_seconds")
                );
                for x in ss["sessions"].as_array().into_iter().flatten() {
                    println!(
                        "  {:<22} {:<10} {:>7}  {}",
                        s(x, "id"),
                        s(x, "state"),
                        result_text(&x["result"]),
                        s(x, "candidate")
                    );
                }
            }
        }
        RoundCmd::Invite {
            id,
            candidate,
            json,
        } => {
            let r = c
                .request_json(
                    Method::POST,
                    &format!("/v1/rounds/{}/sessions", enc(&id)),
                    Some(&json!({ "candidate": candidate })),
                )
                .await?;
            if json {
                print(&r);
            } else {
                println!("{}", s(&r, "url"));
                eprintln!(
                    "session {} ({}), expires {}",
                    s(&r, "id"),
                    s(&r, "state"),
                    s(&r, "expires_at")
                );
            }
        }
        RoundCmd::Interviewer { id, ttl, json } => {
            let body = match ttl {
                Some(t) => json!({ "ttl_seconds": t }),
                None => json!({}),
            };
            let r = c
                .request_json(
                    Method::POST,
                    &format!("/v1/rounds/{}/interviewer-tokens", enc(&id)),
                    Some(&body),
                )
                .await?;
            if json {
                print(&r);
            } else {
                println!("{}", s(&r, "url"));
                eprintln!("interviewer token, expires {}", s(&r, "expires_at"));
            }
        }
        RoundCmd::Report { id, session, json } => {
            let r = c
                .request_json(
                    Method::GET,
                    &format!("/v1/rounds/{}/sessions/{}/report", enc(&id), enc(&session)),
                    None,
                )
                .await?;
            if json {
                print(&r);
            } else {
                println!(
                    "{} {} ({})",
                    s(&r, "session_id"),
                    s(&r, "candidate"),
                    s(&r, "state")
                );
                for sub in r["submissions"].as_array().into_iter().flatten() {
                    println!(
                        "submission {} at {} sha256 {}",
                        s(sub, "submission_id"),
                        s(sub, "submitted_at"),
                        s(sub, "sha256")
                    );
                    for g in sub["gradings"].as_array().into_iter().flatten() {
                        println!(
                            "  grading {}: {}/{} ({})",
                            s(g, "grading_id"),
                            s(g, "passed"),
                            s(g, "total"),
                            s(g, "status")
                        );
                        for case in g["cases"].as_array().into_iter().flatten() {
                            let mark = if case["ok"] == Value::Bool(true) {
                                "ok  "
                            } else {
                                "FAIL"
                            };
                            println!("    {mark} {}", s(case, "name"));
                            if case["ok"] != Value::Bool(true) {
                                for line in s(case, "detail").lines() {
                                    println!("         {line}");
                                }
                            }
                        }
                    }
                }
            }
        }
        RoundCmd::Replay {
            id,
            session,
            list,
            fork,
            json,
        } => {
            let base = format!("/v1/rounds/{}/sessions/{}/replays", enc(&id), enc(&session));
            if let Some(rid) = fork {
                let f = c
                    .request_json(
                        Method::POST,
                        &format!("/v1/rounds/{}/replays/{}/forks", enc(&id), enc(&rid)),
                        None,
                    )
                    .await?;
                let files = c
                    .request_json(
                        Method::GET,
                        &format!("/v1/rounds/{}/forks/{}/files", enc(&id), enc(&s(&f, "id"))),
                        None,
                    )
                    .await?;
                if json {
                    print(&json!({"fork": f, "files": files["files"]}));
                } else {
                    println!("{}", s(&f, "id"));
                    eprintln!(
                        "sandbox {} (deny-all egress), expires {}",
                        s(&f, "sandbox_id"),
                        s(&f, "expires_at")
                    );
                    for p in files["files"].as_array().into_iter().flatten() {
                        println!("  {}", p.as_str().unwrap_or_default());
                    }
                }
            } else if list {
                let r = c.request_json(Method::GET, &base, None).await?;
                if json {
                    print(&r);
                } else {
                    for x in r["replays"].as_array().into_iter().flatten() {
                        println!(
                            "{:<22} {:<9} {:<8} until {}",
                            s(x, "id"),
                            s(x, "reason"),
                            s(x, "state"),
                            s(x, "expires_at")
                        );
                    }
                }
            } else {
                let r = c.request_json(Method::POST, &base, None).await?;
                if json {
                    print(&r);
                } else {
                    println!("{}", s(&r, "id"));
                }
            }
        }
    }
    Ok(0)
}
