//! `hatchery session create|ls|get|events|message|approve|cancel`: agent
//! sessions (`/v1/sessions`).

use crate::client::Api;
use crate::output::{self, kv_map, s, table, when};
use anyhow::bail;
use clap::Subcommand;
use serde_json::{json, Value};

const FINAL: [&str; 3] = ["completed", "failed", "cancelled"];

#[derive(clap::Args)]
pub struct CreateArgs {
    /// https://…, git://… or file:///… (under an allowed root); may be
    /// left out with --environment.
    #[arg(long, required_unless_present = "environment")]
    pub repo: Option<String>,
    /// Start from this environment's current version (`hatchery env`).
    #[arg(long)]
    pub environment: Option<String>,
    /// What the agent should do.
    #[arg(long)]
    pub task: String,
    /// Branch, tag or commit (default main).
    #[arg(long = "ref")]
    pub git_ref: Option<String>,
    #[arg(long)]
    pub policy: Option<String>,
    #[arg(long)]
    pub tokens: Option<i64>,
    #[arg(long)]
    pub usd_cents: Option<i64>,
    /// Wall-clock budget in seconds.
    #[arg(long)]
    pub wall: Option<i64>,
    #[arg(long)]
    pub idempotency_key: Option<String>,
    #[arg(long)]
    pub template: Option<String>,
    /// The model endpoint as the sandbox sees it.
    #[arg(long)]
    pub model_url: Option<String>,
    #[arg(long)]
    pub model: Option<String>,
    #[arg(long)]
    pub max_steps: Option<u32>,
    /// Run this instead of the reference agent (a third-party agent).
    #[arg(long)]
    pub agent_command: Option<String>,
    #[arg(long = "env", short = 'e', value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// A label kept with the session and copied to its sandboxes
    /// (repeatable); `tenant=NAME` spreads a tenant's sessions across hosts.
    #[arg(long = "metadata", short = 'm', value_name = "KEY=VALUE")]
    pub metadata: Vec<String>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand)]
pub enum SessionCmd {
    /// Start an agent on a repository; prints the session id.
    // Boxed: its flags dwarf every other subcommand's.
    Create(Box<CreateArgs>),
    /// List sessions, oldest first.
    Ls {
        #[arg(long)]
        state: Option<String>,
        #[arg(long)]
        repo: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Show one session.
    Get {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Print the event log; --follow streams it until the session ends,
    /// reconnecting after the last event seen.
    Events {
        id: String,
        #[arg(long, short = 'f')]
        follow: bool,
        /// Only events after this seq.
        #[arg(long, default_value_t = 0)]
        after: u64,
        /// One JSON object a line.
        #[arg(long)]
        json: bool,
    },
    /// Steer the agent.
    Message { id: String, text: String },
    /// Decide a pending approval (approve, or --deny).
    Approve {
        id: String,
        approval_id: String,
        #[arg(long)]
        deny: bool,
        #[arg(long, default_value = "")]
        note: String,
    },
    /// Move a running session to another version of its policy (default:
    /// the latest); its next egress connections are checked against it.
    Policy {
        id: String,
        #[arg(long)]
        version: Option<u32>,
        #[arg(long)]
        json: bool,
    },
    /// Stop the agent, keep a snapshot for review, end as cancelled.
    Cancel {
        id: String,
        #[arg(long)]
        json: bool,
    },
}

fn check(id: &str) -> anyhow::Result<()> {
    if !id.starts_with("ses_")
        || id.len() != 20
        || !id[4..]
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    {
        bail!("{id:?} is not a session id (ses_ and 16 letters or digits)");
    }
    Ok(())
}

pub fn run(api: &Api, cmd: SessionCmd) -> anyhow::Result<i32> {
    match cmd {
        SessionCmd::Create(a) => {
            let CreateArgs {
                repo,
                environment,
                task,
                git_ref,
                policy,
                tokens,
                usd_cents,
                wall,
                idempotency_key,
                template,
                model_url,
                model,
                max_steps,
                agent_command,
                env,
                metadata,
                json,
            } = *a;
            let mut body = json!({"task": task});
            let set = |b: &mut Value, k: &str, v: Option<Value>| {
                if let Some(v) = v {
                    b[k] = v;
                }
            };
            set(&mut body, "repo", repo.map(Into::into));
            set(&mut body, "environment_id", environment.map(Into::into));
            set(&mut body, "ref", git_ref.map(Into::into));
            set(&mut body, "policy_id", policy.map(Into::into));
            set(
                &mut body,
                "idempotency_key",
                idempotency_key.map(Into::into),
            );
            set(&mut body, "template", template.map(Into::into));
            let mut budget = json!({});
            set(&mut budget, "tokens", tokens.map(Into::into));
            set(&mut budget, "usd_cents", usd_cents.map(Into::into));
            set(&mut budget, "wall_s", wall.map(Into::into));
            if budget.as_object().is_some_and(|m| !m.is_empty()) {
                body["budget"] = budget;
            }
            let mut agent = json!({});
            set(&mut agent, "model_url", model_url.map(Into::into));
            set(&mut agent, "model", model.map(Into::into));
            set(&mut agent, "max_steps", max_steps.map(Into::into));
            if let Some(c) = agent_command {
                agent["kind"] = "command".into();
                agent["command"] = c.into();
            }
            if agent.as_object().is_some_and(|m| !m.is_empty()) {
                body["agent"] = agent;
            }
            if !env.is_empty() {
                body["env"] = Value::Object(kv_map(&env, "--env")?);
            }
            if !metadata.is_empty() {
                body["metadata"] = Value::Object(kv_map(&metadata, "--metadata")?);
            }
            let r = api.send("POST", "/v1/sessions", &body)?;
            output::show(json, &r, |v| println!("{}", s(&v["session_id"])));
        }
        SessionCmd::Ls { state, repo, json } => {
            let mut all = vec![];
            let mut after: Option<String> = None;
            loop {
                let mut q = vec!["limit=1000".to_string()];
                if let Some(s) = &state {
                    q.push(format!("state={}", enc(s)));
                }
                if let Some(r) = &repo {
                    q.push(format!("repo={}", enc(r)));
                }
                if let Some(a) = &after {
                    q.push(format!("after={a}"));
                }
                let page = api.get(&format!("/v1/sessions?{}", q.join("&")))?;
                all.extend(page["sessions"].as_array().cloned().unwrap_or_default());
                match page["next_after"].as_str() {
                    Some(a) => after = Some(a.to_string()),
                    None => break,
                }
            }
            output::show(json, &Value::Array(all), |v| {
                let rows: Vec<Vec<String>> = v
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|x| {
                        vec![
                            s(&x["session_id"]),
                            s(&x["state"]),
                            when(&x["created_at"]),
                            s(&x["repo"]),
                            s(&x["reason"]),
                        ]
                    })
                    .collect();
                table(&["ID", "STATE", "CREATED", "REPO", "REASON"], &rows);
            });
        }
        SessionCmd::Get { id, json } => {
            check(&id)?;
            let v = api.get(&format!("/v1/sessions/{id}"))?;
            output::show(json, &v, |v| {
                for k in [
                    "session_id",
                    "state",
                    "repo",
                    "ref",
                    "task",
                    "policy_id",
                    "tenant",
                    "created_at",
                    "started_at",
                    "ended_at",
                    "reason",
                    "waiting",
                    "sandbox_id",
                    "snapshot_id",
                    "review_snapshot_id",
                    "last_seq",
                ] {
                    let key = if k == "ref" { "ref" } else { k };
                    if !v[key].is_null() {
                        println!("{k:<20}{}", s(&v[key]));
                    }
                }
                println!("{:<20}{}", "spend", v["spend"]);
                println!("{:<20}{}", "budget", v["budget"]);
                if !v["pending_approval"].is_null() {
                    println!("{:<20}{}", "pending_approval", v["pending_approval"]);
                }
            });
        }
        SessionCmd::Events {
            id,
            follow,
            after,
            json,
        } => {
            check(&id)?;
            return events(api, &id, follow, after, json);
        }
        SessionCmd::Message { id, text } => {
            check(&id)?;
            let r = api.send(
                "POST",
                &format!("/v1/sessions/{id}/messages"),
                &json!({"text": text}),
            )?;
            println!("{}", s(&r["seq"]));
        }
        SessionCmd::Approve {
            id,
            approval_id,
            deny,
            note,
        } => {
            check(&id)?;
            let decision = if deny { "deny" } else { "approve" };
            api.send(
                "POST",
                &format!("/v1/sessions/{id}/approvals/{}", enc(&approval_id)),
                &json!({"decision": decision, "note": note}),
            )?;
        }
        SessionCmd::Policy { id, version, json } => {
            check(&id)?;
            let body = match version {
                Some(v) => json!({ "version": v }),
                None => json!({}),
            };
            let v = api.send("POST", &format!("/v1/sessions/{id}/policy"), &body)?;
            output::show(json, &v, |v| {
                println!("{} v{}", s(&v["policy_id"]), v["policy_version"])
            });
        }
        SessionCmd::Cancel { id, json } => {
            check(&id)?;
            let v = api.call("POST", &format!("/v1/sessions/{id}:cancel"))?;
            output::show(json, &v, |v| println!("{}", s(&v["state"])));
        }
    }
    Ok(0)
}

fn enc(v: &str) -> String {
    v.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn print_event(e: &Value, json_out: bool) {
    if json_out {
        println!("{e}");
        return;
    }
    let mut rest = e.clone();
    if let Some(m) = rest.as_object_mut() {
        for k in ["seq", "at", "actor", "type"] {
            m.remove(k);
        }
    }
    let mut detail = rest.to_string();
    if detail.len() > 160 {
        let mut cut = 160;
        while !detail.is_char_boundary(cut) {
            cut -= 1;
        }
        detail.truncate(cut);
        detail.push('…');
    }
    println!(
        "{:>5}  {}  {:<6}  {:<18} {detail}",
        s(&e["seq"]),
        s(&e["at"]),
        s(&e["actor"]),
        s(&e["type"])
    );
}

/// Exit status: 0 once the session completed, 1 if it failed or was
/// cancelled (when following), 0 for a plain listing.
fn events(
    api: &Api,
    id: &str,
    follow: bool,
    mut after: u64,
    json_out: bool,
) -> anyhow::Result<i32> {
    if !follow {
        loop {
            let page = api.get(&format!(
                "/v1/sessions/{id}/events?format=json&limit=1000&after={after}"
            ))?;
            for e in page["events"].as_array().into_iter().flatten() {
                print_event(e, json_out);
                after = e["seq"].as_u64().unwrap_or(after);
            }
            if page["has_more"] != Value::Bool(true) {
                return Ok(0);
            }
        }
    }
    let mut failures = 0u32;
    loop {
        let stream = api.events(
            "GET",
            &format!("/v1/sessions/{id}/events?format=sse&after={after}"),
            None,
        );
        match stream {
            Ok(evs) => {
                for ev in evs {
                    let Ok(ev) = ev else { break };
                    let e = ev.data;
                    let seq = e["seq"].as_u64().unwrap_or(0);
                    if seq <= after {
                        continue;
                    }
                    after = seq;
                    failures = 0;
                    print_event(&e, json_out);
                    if e["type"] == "state_changed"
                        && FINAL.contains(&e["to"].as_str().unwrap_or(""))
                    {
                        return Ok(if e["to"] == "completed" { 0 } else { 1 });
                    }
                }
            }
            Err(e)
                if crate::client::api_code(&e).is_some()
                    && crate::client::api_code(&e) != Some("too_many_streams") =>
            {
                return Err(e)
            }
            Err(_) => {}
        }
        // Dropped (daemon restart, network): reconnect after the last seq.
        failures += 1;
        if failures > 60 {
            bail!("the event stream of {id} keeps breaking");
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
        let v = api.get(&format!("/v1/sessions/{id}"));
        if let Ok(v) = v {
            if FINAL.contains(&v["state"].as_str().unwrap_or(""))
                && v["last_seq"].as_u64() == Some(after)
            {
                return Ok(if v["state"] == "completed" { 0 } else { 1 });
            }
        }
    }
}
