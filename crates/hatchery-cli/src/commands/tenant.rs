//! `hatchery tenant create|ls|show|update|rm` and
//! `hatchery tenant key create|ls|revoke`:
//! the operator's commands for tenants and their API keys (api.md,
//! "Tenants"). A key is printed once, when made; the daemon keeps only its
//! hash.

use crate::client::Api;
use crate::output::{self, s};
use clap::{Args, Subcommand};
use serde_json::{json, Map, Value};

#[derive(Subcommand)]
pub enum TenantCmd {
    /// Make a tenant; prints its id.
    Create {
        name: String,
        #[command(flatten)]
        limits: LimitArgs,
        #[arg(long)]
        json: bool,
    },
    /// List tenants, oldest first.
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// One tenant: its name and limits.
    #[command(alias = "get")]
    Show {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Rename a tenant or change some of its limits; limits not named keep
    /// their value (`--unlimited NAME` lifts one).
    Update {
        id: String,
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        limits: LimitArgs,
        /// Make a limit unlimited: tokens, usd_cents, concurrent_sessions,
        /// live_sandboxes or wall_clock_seconds (repeatable).
        #[arg(long, value_name = "LIMIT")]
        unlimited: Vec<String>,
        #[arg(long)]
        json: bool,
    },
    /// Delete tenants and all their keys (refused while one has live sandboxes).
    #[command(alias = "delete")]
    Rm {
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// A tenant's API keys.
    #[command(subcommand, alias = "keys")]
    Key(KeyCmd),
}

/// Each limit the tenant gets; an absent one is unlimited.
#[derive(Args)]
pub struct LimitArgs {
    /// Model tokens over the tenant's sessions.
    #[arg(long)]
    tokens: Option<u64>,
    /// Model spend, in US cents.
    #[arg(long)]
    usd_cents: Option<u64>,
    /// Sessions running at once.
    #[arg(long)]
    concurrent_sessions: Option<u64>,
    /// Sandboxes alive at once.
    #[arg(long)]
    live_sandboxes: Option<u64>,
    /// Wall-clock seconds over the tenant's sessions.
    #[arg(long)]
    wall_clock_seconds: Option<u64>,
}

/// The daemon's limit names, in `LimitArgs`' order.
const LIMITS: [&str; 5] = [
    "tokens",
    "usd_cents",
    "concurrent_sessions",
    "live_sandboxes",
    "wall_clock_seconds",
];

impl LimitArgs {
    fn given(&self) -> [Option<u64>; 5] {
        [
            self.tokens,
            self.usd_cents,
            self.concurrent_sessions,
            self.live_sandboxes,
            self.wall_clock_seconds,
        ]
    }

    fn to_json(&self) -> Value {
        let mut m = Map::new();
        for (k, v) in LIMITS.iter().zip(self.given()) {
            if let Some(v) = v {
                m.insert((*k).into(), v.into());
            }
        }
        Value::Object(m)
    }

    /// The limits a PATCH sends: the daemon replaces all five at once, so
    /// the stored ones are kept unless named here or lifted.
    fn merged(&self, stored: &Value, unlimited: &[String]) -> anyhow::Result<Value> {
        for u in unlimited {
            if !LIMITS.contains(&u.as_str()) {
                anyhow::bail!(
                    "--unlimited {u:?}: not a limit (one of {})",
                    LIMITS.join(", ")
                );
            }
        }
        let mut m = Map::new();
        for (k, v) in LIMITS.iter().zip(self.given()) {
            if v.is_some() && unlimited.iter().any(|u| u == k) {
                anyhow::bail!("--{} and --unlimited {k} contradict", k.replace('_', "-"));
            }
            let kept = (!unlimited.iter().any(|u| u == k)).then(|| stored[*k].clone());
            match v.map(Value::from).or(kept) {
                Some(x) if !x.is_null() => {
                    m.insert((*k).into(), x);
                }
                _ => {}
            }
        }
        Ok(Value::Object(m))
    }
}

#[derive(Subcommand)]
pub enum KeyCmd {
    /// Make a key for a tenant; prints it. It cannot be shown again.
    Create {
        tenant: String,
        #[arg(long)]
        json: bool,
    },
    /// A tenant's keys (prefixes only), revoked ones included.
    Ls {
        tenant: String,
        #[arg(long)]
        json: bool,
    },
    /// Revoke keys of a tenant; each is refused from the next request on.
    Revoke {
        tenant: String,
        #[arg(required = true)]
        keys: Vec<String>,
    },
}

pub fn run(api: &Api, cmd: TenantCmd) -> anyhow::Result<i32> {
    match cmd {
        TenantCmd::Create { name, limits, json } => {
            let body = json!({ "name": name, "limits": limits.to_json() });
            let t = api.send("POST", "/v1/tenants", &body)?;
            output::show(json, &t, |v| println!("{}", s(&v["id"])));
        }
        TenantCmd::Ls { json } => {
            let list = api.get("/v1/tenants")?;
            output::show(json, &list["tenants"], print_tenants);
        }
        TenantCmd::Show { id, json } => {
            let t = api.get(&format!("/v1/tenants/{}", segment(&id)?))?;
            output::show(json, &t, |v| print_tenants(&Value::Array(vec![v.clone()])));
        }
        TenantCmd::Update {
            id,
            name,
            limits,
            unlimited,
            json,
        } => {
            let path = format!("/v1/tenants/{}", segment(&id)?);
            let mut body = Map::new();
            if let Some(n) = name {
                body.insert("name".into(), n.into());
            }
            if limits.given().iter().any(Option::is_some) || !unlimited.is_empty() {
                let stored = api.get(&path)?;
                body.insert(
                    "limits".into(),
                    limits.merged(&stored["limits"], &unlimited)?,
                );
            }
            if body.is_empty() {
                anyhow::bail!("nothing to change: give --name or a limit");
            }
            let t = api.send("PATCH", &path, &Value::Object(body))?;
            output::show(json, &t, |v| print_tenants(&Value::Array(vec![v.clone()])));
        }
        TenantCmd::Rm { ids } => {
            for id in &ids {
                api.delete(&format!("/v1/tenants/{}", segment(id)?))?;
                println!("{id}");
            }
        }
        TenantCmd::Key(KeyCmd::Create { tenant, json }) => {
            let k = api.call("POST", &format!("/v1/tenants/{}/keys", segment(&tenant)?))?;
            output::show(json, &k, |v| {
                println!("{}", s(&v["key"]));
                eprintln!(
                    "hatchery: key {} shown once; only its hash is kept",
                    s(&v["id"])
                );
            });
        }
        TenantCmd::Key(KeyCmd::Ls { tenant, json }) => {
            let list = api.get(&format!("/v1/tenants/{}/keys", segment(&tenant)?))?;
            output::show(json, &list["keys"], print_keys);
        }
        TenantCmd::Key(KeyCmd::Revoke { tenant, keys }) => {
            let t = segment(&tenant)?;
            for k in &keys {
                api.delete(&format!("/v1/tenants/{t}/keys/{}", segment(k)?))?;
                println!("{k}");
            }
        }
    }
    Ok(0)
}

/// An id as one path segment: the daemon's ids are `[a-z0-9_]`, so anything
/// else is refused here rather than sent as another path.
fn segment(id: &str) -> anyhow::Result<&str> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if ok {
        Ok(id)
    } else {
        anyhow::bail!("{id:?} is not a tenant or key id (ten_… or key_…)")
    }
}

fn limit(v: &Value) -> String {
    if v.is_null() {
        "-".into()
    } else {
        s(v)
    }
}

fn print_tenants(list: &Value) {
    let rows: Vec<Vec<String>> = list
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            let l = &t["limits"];
            vec![
                s(&t["id"]),
                s(&t["name"]),
                limit(&l["live_sandboxes"]),
                limit(&l["concurrent_sessions"]),
                limit(&l["tokens"]),
                limit(&l["usd_cents"]),
                limit(&l["wall_clock_seconds"]),
                output::when(&t["created_at"]),
            ]
        })
        .collect();
    output::table(
        &[
            "ID",
            "NAME",
            "SANDBOXES",
            "SESSIONS",
            "TOKENS",
            "USD CENTS",
            "WALL S",
            "CREATED",
        ],
        &rows,
    );
}

fn print_keys(list: &Value) {
    let rows: Vec<Vec<String>> = list
        .as_array()
        .into_iter()
        .flatten()
        .map(|k| {
            vec![
                s(&k["id"]),
                format!("{}…", s(&k["prefix"])),
                output::when(&k["created_at"]),
                if k["revoked_at"].is_null() {
                    "-".into()
                } else {
                    s(&k["revoked_at"])
                },
            ]
        })
        .collect();
    output::table(&["ID", "PREFIX", "CREATED", "REVOKED"], &rows);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_stay_one_path_segment() {
        assert!(segment("ten_0123456789abcdef").is_ok());
        for bad in ["", "../x", "ten_a/keys", "a?b", &"a".repeat(65)] {
            assert!(segment(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn only_given_limits_are_sent() {
        let l = LimitArgs {
            tokens: None,
            usd_cents: Some(5),
            concurrent_sessions: None,
            live_sandboxes: Some(0),
            wall_clock_seconds: None,
        };
        assert_eq!(l.to_json(), json!({"usd_cents": 5, "live_sandboxes": 0}));
    }

    #[test]
    fn an_update_keeps_the_limits_it_does_not_name() {
        let l = LimitArgs {
            tokens: Some(9),
            usd_cents: None,
            concurrent_sessions: None,
            live_sandboxes: None,
            wall_clock_seconds: None,
        };
        let stored = json!({"tokens": 1, "usd_cents": 2, "concurrent_sessions": 3,
                            "live_sandboxes": null, "wall_clock_seconds": 5});
        let lifted = vec!["wall_clock_seconds".to_string()];
        assert_eq!(
            l.merged(&stored, &lifted).unwrap(),
            json!({"tokens": 9, "usd_cents": 2, "concurrent_sessions": 3})
        );
        assert!(l.merged(&stored, &["bogus".into()]).is_err());
        assert!(l.merged(&stored, &["tokens".into()]).is_err());
    }
}
