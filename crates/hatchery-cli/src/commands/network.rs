//! `hatchery network get|set|events ID`: a sandbox's egress policy.

use crate::client::{api_code, Api};
use crate::commands::sandbox::{check_id, not_found};
use crate::output::{self, s};
use anyhow::{bail, Context};
use clap::Subcommand;
use serde_json::{json, Value};
use std::net::IpAddr;

#[derive(Subcommand)]
pub enum NetworkCmd {
    /// Show a sandbox's network policy.
    Get {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Replace a sandbox's network policy; prints the policy applied.
    ///
    /// Rules are HOST, IP, CIDR or [IPv6/CIDR], optionally followed by
    /// :PORT[,PORT...] (no ports = every port and protocol), for example
    /// --allow pypi.org:443 --allow 203.0.113.0/24 --deny 198.51.100.7:22.
    Set {
        id: String,
        /// Default for destinations no rule matches.
        #[arg(long, value_parser = ["deny", "allow"], default_value = "deny")]
        egress: String,
        /// Allowed destination, repeatable.
        #[arg(long, value_name = "RULE")]
        allow: Vec<String>,
        /// Denied destination, repeatable.
        #[arg(long, value_name = "RULE")]
        deny: Vec<String>,
        /// The whole policy as JSON text or @FILE instead of the flags above.
        #[arg(long, value_name = "JSON|@FILE", conflicts_with_all = ["allow", "deny", "egress"])]
        policy: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Denied connection attempts, newest last.
    Events {
        id: String,
        #[arg(long)]
        json: bool,
    },
}

pub fn run(api: &Api, cmd: NetworkCmd) -> anyhow::Result<i32> {
    match cmd {
        NetworkCmd::Get { id, json } => {
            check_id(&id, "sbx_")?;
            let p = api
                .get(&format!("/v1/sandboxes/{id}/network"))
                .map_err(|e| missing(api, e, &id))?;
            show(&p, json);
        }
        NetworkCmd::Set {
            id,
            egress,
            allow,
            deny,
            policy,
            json,
        } => {
            check_id(&id, "sbx_")?;
            let body = match policy {
                Some(p) => policy_arg(&p)?,
                None => json!({
                    "egress": egress,
                    "allow": allow.iter().map(|r| rule(r)).collect::<anyhow::Result<Vec<_>>>()?,
                    "deny": deny.iter().map(|r| rule(r)).collect::<anyhow::Result<Vec<_>>>()?,
                }),
            };
            let p = api
                .send("PUT", &format!("/v1/sandboxes/{id}/network"), &body)
                .map_err(|e| missing(api, e, &id))?;
            show(&p, json);
        }
        NetworkCmd::Events { id, json } => {
            check_id(&id, "sbx_")?;
            let ev = api
                .get(&format!("/v1/sandboxes/{id}/network/events"))
                .map_err(|e| missing(api, e, &id))?;
            if json {
                output::json(&ev["events"]);
            } else {
                let rows: Vec<Vec<String>> = ev["events"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|e| {
                        vec![
                            output::when(&e["time"]),
                            s(&e["protocol"]),
                            s(&e["destination"]),
                            s(&e["port"]),
                        ]
                    })
                    .collect();
                output::table(&["TIME", "PROTOCOL", "DESTINATION", "PORT"], &rows);
            }
        }
    }
    Ok(0)
}

/// A 404 `not_found` here means no such route: a daemon from before the
/// network policy API.
fn missing(api: &Api, e: anyhow::Error, id: &str) -> anyhow::Error {
    match api_code(&e) {
        Some("not_found") => anyhow::anyhow!(
            "the daemon at {} has no network policy API; upgrade it to use `hatchery network`",
            api.url
        ),
        _ => not_found(e, id),
    }
}

fn show(p: &Value, json: bool) {
    if json {
        return output::json(p);
    }
    println!("egress: {}", s(&p["egress"]));
    for list in ["allow", "deny"] {
        let rules: Vec<String> = p[list]
            .as_array()
            .into_iter()
            .flatten()
            .map(rule_text)
            .collect();
        println!(
            "{list}: {}",
            if rules.is_empty() {
                "-".into()
            } else {
                rules.join(" ")
            }
        );
    }
}

fn rule_text(r: &Value) -> String {
    let target = if r["cidr"].is_string() {
        s(&r["cidr"])
    } else {
        s(&r["host"])
    };
    let ports: Vec<String> = r["ports"].as_array().into_iter().flatten().map(s).collect();
    if ports.is_empty() {
        target
    } else if target.contains(':') {
        format!("[{target}]:{}", ports.join(","))
    } else {
        format!("{target}:{}", ports.join(","))
    }
}

/// A policy given as JSON text or @FILE.
pub fn policy_arg(arg: &str) -> anyhow::Result<Value> {
    let text = match arg.strip_prefix('@') {
        Some(f) => std::fs::read_to_string(f).with_context(|| format!("reading {f}"))?,
        None => arg.to_string(),
    };
    let v: Value = serde_json::from_str(&text).context("the network policy is not JSON")?;
    if !v.is_object() {
        bail!("the network policy is a JSON object such as {{\"egress\":\"deny\"}}");
    }
    Ok(v)
}

/// HOST, IP, CIDR or [IPv6...], then optional :PORT,PORT.
fn rule(arg: &str) -> anyhow::Result<Value> {
    let (target, ports) = if let Some(rest) = arg.strip_prefix('[') {
        let (t, after) = rest.split_once(']').context("missing ] in an IPv6 rule")?;
        match after.strip_prefix(':') {
            Some(p) => (t, Some(p)),
            None if after.is_empty() => (t, None),
            None => bail!("unexpected {after:?} after ] in {arg:?}"),
        }
    } else if arg.matches(':').count() > 1 {
        (arg, None) // IPv6 without brackets: no ports
    } else {
        match arg.split_once(':') {
            Some((t, p)) => (t, Some(p)),
            None => (arg, None),
        }
    };
    if target.is_empty() {
        bail!("empty destination in rule {arg:?}");
    }
    let mut r = if let Ok(ip) = target.parse::<IpAddr>() {
        json!({ "cidr": format!("{ip}/{}", if ip.is_ipv4() { 32 } else { 128 }) })
    } else if target.contains('/') {
        json!({ "cidr": target })
    } else {
        json!({ "host": target })
    };
    if let Some(p) = ports {
        let ports = p
            .split(',')
            .map(|x| {
                x.trim()
                    .parse::<u16>()
                    .with_context(|| format!("bad port {x:?} in {arg:?}"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        r["ports"] = json!(ports);
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules() {
        assert_eq!(
            rule("pypi.org:443").unwrap(),
            json!({"host":"pypi.org","ports":[443]})
        );
        assert_eq!(
            rule("203.0.113.0/24").unwrap(),
            json!({"cidr":"203.0.113.0/24"})
        );
        assert_eq!(
            rule("198.51.100.7:22,80").unwrap(),
            json!({"cidr":"198.51.100.7/32","ports":[22,80]})
        );
        assert_eq!(
            rule("2001:db8::/32").unwrap(),
            json!({"cidr":"2001:db8::/32"})
        );
        assert_eq!(
            rule("[2001:db8::1]:443").unwrap(),
            json!({"cidr":"2001:db8::1/128","ports":[443]})
        );
        assert!(rule("host:http").is_err());
        assert!(rule(":443").is_err());
        assert_eq!(
            rule_text(&json!({"cidr":"2001:db8::/32","ports":[1]})),
            "[2001:db8::/32]:1"
        );
        assert!(policy_arg("[1]").is_err());
    }
}
