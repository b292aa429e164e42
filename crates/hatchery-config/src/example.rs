//! `hatcheryd config example --role ROLE`: a commented configuration file
//! for one role, from the flags themselves (help text, default), so it
//! cannot drift from them. The keys a role needs set are set; every other
//! key that matters to the role is shown commented out, at its default.

use crate::file::flag;
use crate::keys::{self, Key, Kind, ALL, CONTROL, HOST};
use crate::roles::Role;
use clap::Command;
use std::fmt::Write;

/// Values an example sets for a role (placeholders an operator replaces).
fn set_for(role: Role) -> &'static [(&'static str, &'static str)] {
    match role {
        Role::All => &[],
        Role::Host => &[
            ("store.db", "\"postgres://hatchery@db.internal/hatchery\""),
            ("role.name", "\"host\""),
            ("role.host_id", "\"host-1\""),
            ("role.advertise_url", "\"http://10.0.0.11:7423\""),
            ("server.listen", "\"10.0.0.11:7423\""),
            ("broker.control_url", "\"http://control.internal:7423\""),
            ("gateway.control_url", "\"http://control.internal:7423\""),
        ],
        Role::Control => &[
            ("store.db", "\"postgres://hatchery@db.internal/hatchery\""),
            ("role.name", "\"control\""),
            ("role.host_id", "\"control-1\""),
            ("server.listen", "\"10.0.0.10:7423\""),
            ("broker.for_hosts", "true"),
        ],
    }
}

pub fn example(cmd: &Command, role: Role) -> String {
    let bit = match role {
        Role::All => ALL,
        Role::Host => HOST,
        Role::Control => CONTROL,
    };
    let set = set_for(role);
    let mut out = format!(
        "# hatcheryd --config FILE, role `{}` (`hatcheryd config example --role {}`).\n\
         # A flag or HATCHERY_* variable beats the file; `hatcheryd config check FILE`\n\
         # reports every problem with it. Commented keys show their defaults.\n",
        role.name(),
        role.name()
    );
    for section in keys::SECTIONS {
        let ks: Vec<&Key> = keys::KEYS
            .iter()
            .filter(|k| k.section == *section && k.roles & bit != 0)
            .collect();
        if ks.is_empty() {
            continue;
        }
        let _ = write!(out, "\n[{section}]\n");
        for k in ks {
            let arg = flag(cmd, k);
            // Its flag and variable, which beat it (and which tests read
            // to turn a daemon's flags into a file: tests/integration).
            let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
            let _ = writeln!(
                out,
                "# --{}, {}: {}",
                k.long,
                env.unwrap_or_default(),
                k.kind.describe()
            );
            let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
            for line in wrap(&help, 76) {
                let _ = writeln!(out, "# {line}");
            }
            let path = k.path();
            let _ = match set.iter().find(|(p, _)| *p == path) {
                Some((_, v)) => writeln!(out, "{} = {v}", k.name),
                None => {
                    let defaults: Vec<String> = arg
                        .get_default_values()
                        .iter()
                        .map(|d| d.to_string_lossy().into_owned())
                        .collect();
                    match value(k.kind, &defaults) {
                        Some(v) => writeln!(out, "# {} = {v}", k.name),
                        None => writeln!(out, "# {} = (unset)", k.name),
                    }
                }
            };
        }
    }
    out
}

/// A default as TOML.
fn value(kind: Kind, defaults: &[String]) -> Option<String> {
    let quote = |s: &String| toml::Value::String(s.clone()).to_string();
    match kind {
        // A switch's default (false) is only set when clap builds the
        // command.
        Kind::Bool if defaults.is_empty() => Some("false".into()),
        Kind::List => Some(format!(
            "[{}]",
            defaults.iter().map(quote).collect::<Vec<_>>().join(", ")
        )),
        _ => {
            let d = defaults.first()?;
            Some(match kind {
                Kind::Str => quote(d),
                _ => d.clone(),
            })
        }
    }
}

/// `text` in lines of at most `width` characters (longer words alone).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = vec![String::new()];
    for word in text.split_whitespace() {
        let last = lines.last_mut().expect("one line at least");
        if !last.is_empty() && last.len() + 1 + word.len() > width {
            lines.push(word.to_string());
        } else {
            if !last.is_empty() {
                last.push(' ');
            }
            last.push_str(word);
        }
    }
    lines
}
