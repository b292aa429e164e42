//! The rules between settings, checked once, as a whole, before the daemon
//! starts anything: every broken rule is reported, each naming the key and
//! where its value came from (a flag, a variable, or the file).

use crate::args::DaemonArgs;
use crate::error::Problem;
use crate::file::{flag, FileSettings};
use crate::keys;
use crate::roles::Role;
use clap::parser::ValueSource;
use clap::{ArgMatches, Command};

/// Where each setting came from, to name it in a problem.
pub struct Origins<'a> {
    pub cmd: &'a Command,
    pub matches: &'a ArgMatches,
    pub file: Option<&'a FileSettings>,
}

impl Origins<'_> {
    /// `--db`, `HATCHERY_DB`, `FILE: store.db`, or `store.db (--db)` for a
    /// default.
    pub fn at(&self, path: &str) -> String {
        let key = keys::at(path);
        let arg = flag(self.cmd, key);
        match self.matches.value_source(arg.get_id().as_str()) {
            Some(ValueSource::CommandLine) => format!("--{}", key.long),
            Some(ValueSource::EnvVariable) => arg
                .get_env()
                .map(|e| e.to_string_lossy().into_owned())
                .unwrap_or_else(|| format!("--{}", key.long)),
            _ => match self.file.filter(|f| f.sets(key)) {
                Some(f) => format!("{}: `{path}`", f.path.display()),
                None => format!("`{path}` (--{})", key.long),
            },
        }
    }
}

/// Every broken rule of `a`.
pub fn check(a: &DaemonArgs, o: &Origins) -> Vec<Problem> {
    let mut out = Vec::new();
    let mut bad = |path: &str, message: String| {
        out.push(Problem::Rule {
            at: o.at(path),
            message,
        })
    };
    let shared = a.shared_db().is_some();
    if a.role != Role::All && !shared {
        bad(
            "role.name",
            format!(
                "`{}` needs --db postgres://... (store.db), shared with the {}",
                a.role.name(),
                if a.role == Role::Host {
                    "control plane"
                } else {
                    "hosts"
                }
            ),
        );
    }
    if a.gateway.has_upstream() && a.gateway.prices.is_none() {
        bad(
            "gateway.prices",
            "is required with a gateway upstream (gateway.openai_upstream or anthropic_upstream)"
                .into(),
        );
    }
    if let Some(url) = &a.gateway.control_url {
        if a.role == Role::Control {
            bad(
                "gateway.control_url",
                "is for hosts; the control role runs the gateway itself".into(),
            );
        }
        if a.gateway.has_upstream() {
            bad(
                "gateway.control_url",
                "a host that relays to the control role's gateway takes no upstream of its own"
                    .into(),
            );
        }
        if !url.starts_with("http://") {
            bad(
                "gateway.control_url",
                format!("{url}: only http:// URLs are supported"),
            );
        }
        if !shared {
            bad(
                "gateway.control_url",
                "needs a shared postgres:// store.db (the control role reads the bindings there)"
                    .into(),
            );
        }
    }
    if let (Some(url), true) = (&a.broker.control_url, a.role.runs_sandboxes()) {
        if !url.starts_with("http://") {
            bad(
                "broker.control_url",
                format!("{url}: only http:// URLs are supported"),
            );
        }
        if a.broker.holds_credentials() {
            bad(
                "broker.control_url",
                "a host that relays to the control role's broker takes no credential, push URL, \
                 forge or MCP server of its own"
                    .into(),
            );
        }
        if a.broker.guest_port == 0 {
            bad(
                "broker.control_url",
                "broker.guest_port 0 turns the broker off".into(),
            );
        }
    }
    for r in &a.broker.git_push_urls {
        if !matches!(r.split_once('='), Some((f, t)) if !f.is_empty() && !t.is_empty()) {
            bad("broker.git_push_urls", format!("{r:?}: expected FROM=TO"));
        }
    }
    if let Some(hook) = &a.broker.anchor_hook {
        if let Err(e) = hatchery_broker::config::parse_anchor_hook(hook) {
            bad("audit.anchor_hook", e.to_string());
        }
    }
    if let Err(e) = hatchery_broker::config::anchor_s3(&a.broker) {
        // The URL's reason is the error's source.
        let why = std::error::Error::source(&e)
            .map(|s| format!("{e}: {s}"))
            .unwrap_or_else(|| e.to_string());
        // A CA file's own mistake is named by its key.
        let key = match &e {
            hatchery_broker::config::AnchorS3Error::CaWithoutUrl
            | hatchery_broker::config::AnchorS3Error::CaWithoutTls => "audit.anchor_s3_ca_file",
            _ => "audit.anchor_s3_url",
        };
        bad(key, why);
    }
    out
}
