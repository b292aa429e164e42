//! `hatchery tenant create|ls|rm` and `hatchery tenant key create|ls|revoke`:
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

impl LimitArgs {
    fn to_json(&self) -> Value {
        let mut m = Map::new();
        for (k, v) in [
            ("tokens", self.tokens),
            ("usd_cents", self.usd_cents),
            ("concurrent_sessions", self.concurrent_sessions),
            ("live_sandboxes", self.live_sandboxes),
            ("wall_clock_seconds", self.wall_clock_seconds),
        ] {
            if let Some(v) = v {
                m.insert(k.into(), v.into());
            }
        }
        Value::Object(m)
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
}
