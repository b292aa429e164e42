//! Operator settings for the broker (daemon flags, `HATCHERY_BROKER_*`).

use crate::http_client::Trust;
use crate::mcp::McpHub;
use clap::Args;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Debug, Clone, Args)]
pub struct BrokerArgs {
    /// Where sandbox code reaches the broker: `http://127.0.0.1:PORT` in
    /// every sandbox (a host service named `broker`). 0 turns it off.
    #[arg(
        id = "broker_guest_port",
        long = "broker-guest-port",
        env = "HATCHERY_BROKER_GUEST_PORT",
        default_value_t = 9200
    )]
    pub guest_port: u16,
    /// `FROM=TO`: push to `TO…` instead of a session repository URL that
    /// starts with `FROM` (like git's `pushInsteadOf`; repeatable).
    #[arg(
        id = "broker_git_push_url",
        long = "broker-git-push-url",
        env = "HATCHERY_BROKER_GIT_PUSH_URLS",
        value_delimiter = ' '
    )]
    pub git_push_urls: Vec<String>,
    /// A file with the HTTP header (`Authorization: ...`) `git_push` sends:
    /// the write credential. Read by the host only, at each push.
    #[arg(
        id = "broker_git_credential_file",
        long = "broker-git-credential-file",
        env = "HATCHERY_BROKER_GIT_CREDENTIAL_FILE"
    )]
    pub git_credential_file: Option<PathBuf>,
    /// Hosts (`host` or `host:port`, repeatable) a tenant's session's
    /// `git_push` may send the write credential to (the push URL's host,
    /// after `--broker-git-push-url`). The operator's sessions always send
    /// it; a tenant's to any other host push without it (issue 36: the
    /// tenant names the repository).
    #[arg(
        id = "broker_git_credential_host",
        long = "broker-git-credential-host",
        env = "HATCHERY_BROKER_GIT_CREDENTIAL_HOSTS",
        value_delimiter = ' '
    )]
    pub git_credential_hosts: Vec<String>,
    /// Base URL of a GitHub-compatible REST API for `open_pr`:
    /// `https://host[:port][/prefix]`, or `http://` to a loopback address
    /// only (a local relay; the token must not travel in clear).
    #[arg(
        id = "broker_github_api",
        id = "broker_github_api",
        long = "broker-github-api",
        env = "HATCHERY_BROKER_GITHUB_API"
    )]
    pub github_api: Option<String>,
    /// A PEM bundle the broker's https calls (`http_fetch`, the forge
    /// API) trust instead of the system's (a private CA, a test CA).
    #[arg(
        id = "broker_ca_file",
        long = "broker-ca-file",
        env = "HATCHERY_BROKER_CA_FILE"
    )]
    pub ca_file: Option<PathBuf>,
    /// A file with the token `open_pr` sends (`Authorization: Bearer`).
    #[arg(
        id = "broker_github_token_file",
        long = "broker-github-token-file",
        env = "HATCHERY_BROKER_GITHUB_TOKEN_FILE"
    )]
    pub github_token_file: Option<PathBuf>,
    /// Seconds between anchorings of the session event chains' heads to
    /// DATA_DIR/session-anchors.jsonl (append-only, fsynced); 0 turns it off.
    #[arg(
        id = "broker_anchor_interval",
        long = "audit-anchor-interval",
        env = "HATCHERY_AUDIT_ANCHOR_INTERVAL",
        default_value_t = 60
    )]
    pub anchor_interval_s: u64,
    /// Where the anchor lines are appended (default
    /// DATA_DIR/session-anchors.jsonl). Put it outside the data dir, on
    /// storage the daemon's data-dir writer cannot rewrite (another mount,
    /// append-only): a copy of the heads there is what `hatchery audit
    /// verify --anchors FILE` checks the chains against.
    #[arg(
        id = "broker_anchor_file",
        long = "audit-anchor-file",
        env = "HATCHERY_AUDIT_ANCHOR_FILE"
    )]
    pub anchor_file: Option<PathBuf>,
    /// A command that also gets each batch of new anchor lines on stdin
    /// and must exit 0 (write-once storage: an object-lock bucket, a
    /// WORM volume), as a JSON array argv with an absolute program path,
    /// e.g. `["/usr/local/bin/worm-put","--bucket","audit"]`. Run after
    /// the file is fsynced; a failure is logged and retried with the next
    /// batch's lines.
    #[arg(
        id = "broker_anchor_hook",
        long = "audit-anchor-hook",
        env = "HATCHERY_AUDIT_ANCHOR_HOOK"
    )]
    pub anchor_hook: Option<String>,
    /// An S3-compatible bucket each round's anchor lines are also put to,
    /// as a new object (`PREFIX/all/TIME-NODE-N.jsonl`, never an
    /// overwrite): `https://host[:port]/BUCKET[/PREFIX]` (path-style), or
    /// `http://` to a loopback address. With object lock / retention on
    /// the bucket, anchored heads are out of the daemon's reach. `hatchery
    /// audit verify --anchors-s3-url` checks chains against them.
    #[arg(
        id = "broker_anchor_s3_url",
        long = "audit-anchor-s3-url",
        env = "HATCHERY_AUDIT_ANCHOR_S3_URL"
    )]
    pub anchor_s3_url: Option<String>,
    /// The bucket's region (what requests are signed for).
    #[arg(
        id = "broker_anchor_s3_region",
        long = "audit-anchor-s3-region",
        env = "HATCHERY_AUDIT_ANCHOR_S3_REGION",
        default_value = "us-east-1"
    )]
    pub anchor_s3_region: String,
    /// A file with the bucket's access key, in the AWS credentials-file
    /// form (`aws_access_key_id = ...`, `aws_secret_access_key = ...`,
    /// optional `aws_session_token`); read at each put, never on argv or
    /// in the config file. Required with `--audit-anchor-s3-url`.
    #[arg(
        id = "broker_anchor_s3_credentials_file",
        long = "audit-anchor-s3-credentials-file",
        env = "HATCHERY_AUDIT_ANCHOR_S3_CREDENTIALS_FILE"
    )]
    pub anchor_s3_credentials_file: Option<PathBuf>,
    /// A PEM bundle the object store's certificate is verified against
    /// instead of the system's (a private CA, or a test's). Only with an
    /// `https://` `--audit-anchor-s3-url`.
    #[arg(
        id = "broker_anchor_s3_ca_file",
        long = "audit-anchor-s3-ca-file",
        env = "HATCHERY_AUDIT_ANCHOR_S3_CA_FILE"
    )]
    pub anchor_s3_ca_file: Option<PathBuf>,
    /// A JSON file naming the MCP servers whose tools the broker fronts
    /// as `mcp.<server>.<tool>` (docs/sessions.md, "MCP servers").
    #[arg(
        id = "broker_mcp_config",
        long = "broker-mcp-config",
        env = "HATCHERY_BROKER_MCP_CONFIG"
    )]
    pub mcp_config: Option<PathBuf>,
    /// On `--role host`: the control plane (`http://host:port`) whose
    /// broker runs this host's sandboxes' calls. The host then holds no
    /// credential and runs no broker: its `broker` host service relays
    /// each call there (docs/sessions.md, "The broker on many hosts").
    #[arg(
        id = "broker_control_url",
        long = "broker-control-url",
        env = "HATCHERY_BROKER_CONTROL_URL"
    )]
    pub control_url: Option<String>,
    /// On `--role control`: run the tool broker for the hosts that relay
    /// to it (`--broker-control-url`), with this daemon's credentials and
    /// its call record in the shared database.
    #[arg(
        id = "broker_for_hosts",
        long = "broker-for-hosts",
        env = "HATCHERY_BROKER_FOR_HOSTS"
    )]
    pub for_hosts: bool,
    /// Broker calls (distinct seqs) one session may make; one more is
    /// refused with 429 `session_call_cap`.
    #[arg(id = "broker_session_max_calls", long = "broker-session-max-calls",
          env = "HATCHERY_BROKER_SESSION_MAX_CALLS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub session_max_calls: u64,
    /// New broker calls per session and minute (a burst of this many,
    /// refilled evenly over the minute); over it 429 `session_call_rate`.
    #[arg(id = "broker_session_calls_per_minute", long = "broker-session-calls-per-minute",
          env = "HATCHERY_BROKER_SESSION_CALLS_PER_MINUTE", default_value_t = 120,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub session_calls_per_minute: u64,
    /// Bytes of call arguments (canonical JSON) one session's calls may
    /// store; a call that would go past it is refused with 429
    /// `session_arg_bytes_cap`.
    #[arg(id = "broker_session_max_arg_bytes", long = "broker-session-max-arg-bytes",
          env = "HATCHERY_BROKER_SESSION_MAX_ARG_BYTES", default_value_t = 16 << 20,
          value_parser = clap::value_parser!(u64).range(65_536..=(1 << 34)))]
    pub session_max_arg_bytes: u64,
}

impl BrokerArgs {
    /// Whether any credential or outside endpoint is configured: a host
    /// that relays to the control role's broker takes none.
    pub fn holds_credentials(&self) -> bool {
        !self.git_push_urls.is_empty()
            || self.git_credential_file.is_some()
            || self.github_api.is_some()
            || self.github_token_file.is_some()
            || self.mcp_config.is_some()
    }
}

#[derive(Debug, Clone, Default)]
pub struct BrokerConfig {
    pub guest_port: u16,
    pub push_rewrites: Vec<(String, String)>,
    pub git_credential_file: Option<PathBuf>,
    pub git_credential_hosts: Vec<String>,
    pub github_api: Option<String>,
    pub github_token_file: Option<PathBuf>,
    /// What https calls trust (`--broker-ca-file`, else the system's).
    pub trust: Arc<Trust>,
    /// The MCP servers (none without `--broker-mcp-config`).
    pub mcp: Arc<McpHub>,
    /// What one session's calls may store (docs/sessions.md, "Caps").
    pub caps: SessionCallCaps,
    /// Where git scratch repositories are made (`git::scratch_root`; the
    /// system's temporary directory unless the broker is embedded).
    pub scratch: PathBuf,
}

/// Per-session caps on broker calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionCallCaps {
    pub max_calls: u64,
    pub calls_per_minute: u64,
    pub max_arg_bytes: u64,
    /// Calls waiting for an approval at once (the daemon sets it from
    /// `--sessions-max-open-approvals`).
    pub max_open_approvals: u64,
}

impl Default for SessionCallCaps {
    fn default() -> Self {
        SessionCallCaps {
            max_calls: 1000,
            calls_per_minute: 120,
            max_arg_bytes: 16 << 20,
            max_open_approvals: 8,
        }
    }
}

impl std::fmt::Debug for McpHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("--broker-git-push-url {0:?}: expected FROM=TO")]
    PushUrl(String),
    #[error("--broker-mcp-config: {0}")]
    Mcp(#[from] crate::mcp::McpError),
    #[error("--broker-github-api")]
    Forge(#[source] crate::http_client::BaseError),
    #[error("--broker-ca-file")]
    Trust(#[source] hatchery_tls::TrustError),
    #[error("the broker's scratch directory under the data dir")]
    Scratch(#[source] std::io::Error),
}

impl TryFrom<&BrokerArgs> for BrokerConfig {
    type Error = ConfigError;
    fn try_from(a: &BrokerArgs) -> Result<Self, ConfigError> {
        let mut push_rewrites = vec![];
        for r in &a.git_push_urls {
            match r.split_once('=') {
                Some((f, t)) if !f.is_empty() && !t.is_empty() => {
                    push_rewrites.push((f.to_string(), t.to_string()))
                }
                _ => return Err(ConfigError::PushUrl(r.clone())),
            }
        }
        if let Some(base) = &a.github_api {
            crate::http_client::Base::parse(base).map_err(ConfigError::Forge)?;
        }
        let trust = Arc::new(match &a.ca_file {
            Some(p) => {
                let t = Trust::new(p.clone());
                t.check().map_err(ConfigError::Trust)?;
                t
            }
            None => Trust::default(),
        });
        Ok(BrokerConfig {
            trust: trust.clone(),
            guest_port: a.guest_port,
            push_rewrites,
            git_credential_file: a.git_credential_file.clone(),
            git_credential_hosts: a.git_credential_hosts.clone(),
            github_api: a.github_api.clone(),
            github_token_file: a.github_token_file.clone(),
            mcp: Arc::new(match &a.mcp_config {
                Some(p) => McpHub::from_file(p, &trust)?,
                None => McpHub::default(),
            }),
            caps: SessionCallCaps {
                max_calls: a.session_max_calls,
                calls_per_minute: a.session_calls_per_minute,
                max_arg_bytes: a.session_max_arg_bytes,
                ..SessionCallCaps::default()
            },
            scratch: std::env::temp_dir(),
        })
    }
}

impl BrokerConfig {
    /// The URL `git_push` pushes to for a session's repository.
    pub fn push_url(&self, repo: &str) -> String {
        // The longest matching prefix wins, as with git's insteadOf.
        let best = self
            .push_rewrites
            .iter()
            .filter(|(f, _)| repo.starts_with(f.as_str()))
            .max_by_key(|(f, _)| f.len());
        match best {
            Some((f, t)) => format!("{t}{}", &repo[f.len()..]),
            None => repo.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_rewrites() {
        let a = BrokerArgs {
            guest_port: 9200,
            git_push_urls: vec![
                "git://h/=http://h:81/".into(),
                "git://h/acme/=http://h:82/a/".into(),
            ],
            git_credential_file: None,
            git_credential_hosts: vec![],
            github_api: None,
            github_token_file: None,
            ca_file: None,
            anchor_interval_s: 60,
            anchor_hook: None,
            anchor_file: None,
            anchor_s3_url: None,
            anchor_s3_region: "us-east-1".into(),
            anchor_s3_credentials_file: None,
            anchor_s3_ca_file: None,
            mcp_config: None,
            control_url: None,
            for_hosts: false,
            session_max_calls: 1000,
            session_calls_per_minute: 120,
            session_max_arg_bytes: 16 << 20,
        };
        assert!(a.holds_credentials());
        assert!(!BrokerArgs {
            git_push_urls: vec![],
            ..a.clone()
        }
        .holds_credentials());
        let c = BrokerConfig::try_from(&a).unwrap();
        assert_eq!(c.push_url("git://h/x.git"), "http://h:81/x.git");
        assert_eq!(c.push_url("git://h/acme/x.git"), "http://h:82/a/x.git");
        assert_eq!(c.push_url("https://o/x.git"), "https://o/x.git");
        let bad = BrokerArgs {
            git_push_urls: vec!["nope".into()],
            ..a
        };
        assert!(BrokerConfig::try_from(&bad).is_err());
    }
}

/// Why an anchor hook's JSON form was refused (`--audit-anchor-hook`).
#[derive(Debug, thiserror::Error)]
pub enum AnchorHookError {
    #[error("--audit-anchor-hook must be a JSON array of strings: {0}")]
    Json(#[source] serde_json::Error),
    #[error("--audit-anchor-hook is an empty array")]
    Empty,
    #[error("--audit-anchor-hook: the program {0:?} must be an absolute path")]
    Relative(String),
    #[error("--audit-anchor-hook: an argument contains NUL")]
    Nul,
}

/// The anchor hook's argv from its JSON form: a non-empty array of
/// strings whose program is an absolute path (no shell, no PATH lookup).
pub fn parse_anchor_hook(json: &str) -> Result<Vec<String>, AnchorHookError> {
    let argv: Vec<String> = serde_json::from_str(json).map_err(AnchorHookError::Json)?;
    match argv.first() {
        None => Err(AnchorHookError::Empty),
        Some(p) if !p.starts_with('/') => Err(AnchorHookError::Relative(p.clone())),
        Some(_) if argv.iter().any(|a| a.contains('\0')) => Err(AnchorHookError::Nul),
        Some(_) => Ok(argv),
    }
}

/// Why the object-store anchor settings were refused.
#[derive(Debug, thiserror::Error)]
pub enum AnchorS3Error {
    #[error("--audit-anchor-s3-url")]
    Url(#[source] hatchery_audit::s3::LocationError),
    #[error("--audit-anchor-s3-url needs --audit-anchor-s3-credentials-file (the key is never on argv or in the config file)")]
    NoCredentials,
    #[error("--audit-anchor-s3-credentials-file is set without --audit-anchor-s3-url")]
    NoUrl,
    #[error("--audit-anchor-s3-ca-file is set without --audit-anchor-s3-url")]
    CaWithoutUrl,
    /// A CA for a store reached without TLS: a mistake (a URL meant to be
    /// https://), refused rather than ignored.
    #[error("--audit-anchor-s3-ca-file is set but --audit-anchor-s3-url is plain http://")]
    CaWithoutTls,
    #[error(
        "--audit-anchor-s3-region {0:?}: 1 to {MAX_REGION_BYTES} lowercase letters, digits and '-'"
    )]
    Region(String),
}

/// Longer than any region name AWS or the S3-compatible stores use.
pub const MAX_REGION_BYTES: usize = 64;

/// The object-store sink's settings, checked.
#[derive(Debug, Clone)]
pub struct AnchorS3 {
    pub location: hatchery_audit::s3::S3Location,
    pub region: String,
    pub credentials_file: PathBuf,
    /// What its certificate is verified against (None: the system's
    /// bundle).
    pub ca_file: Option<PathBuf>,
}

/// The object-store sink `a` asks for, if any: a valid URL, a region and
/// a credentials file together, and a CA file only for an https:// URL.
pub fn anchor_s3(a: &BrokerArgs) -> Result<Option<AnchorS3>, AnchorS3Error> {
    let r = &a.anchor_s3_region;
    if r.is_empty()
        || r.len() > MAX_REGION_BYTES
        || !r
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    {
        return Err(AnchorS3Error::Region(r.clone()));
    }
    let (url, file) = match (&a.anchor_s3_url, &a.anchor_s3_credentials_file) {
        (None, None) if a.anchor_s3_ca_file.is_some() => return Err(AnchorS3Error::CaWithoutUrl),
        (None, None) => return Ok(None),
        (None, Some(_)) => return Err(AnchorS3Error::NoUrl),
        (Some(_), None) => return Err(AnchorS3Error::NoCredentials),
        (Some(url), Some(file)) => (url, file),
    };
    let location = hatchery_audit::s3::S3Location::parse(url).map_err(AnchorS3Error::Url)?;
    if a.anchor_s3_ca_file.is_some() && !location.tls {
        return Err(AnchorS3Error::CaWithoutTls);
    }
    Ok(Some(AnchorS3 {
        location,
        region: r.clone(),
        credentials_file: file.clone(),
        ca_file: a.anchor_s3_ca_file.clone(),
    }))
}

#[cfg(test)]
mod anchor_s3_tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Flags {
        #[command(flatten)]
        a: BrokerArgs,
    }

    fn args(url: Option<&str>, creds: Option<&str>, region: &str) -> BrokerArgs {
        let mut a = <Flags as clap::Parser>::parse_from(["hatcheryd"]).a;
        a.anchor_s3_ca_file = None;
        a.anchor_s3_url = url.map(Into::into);
        a.anchor_s3_credentials_file = creds.map(Into::into);
        a.anchor_s3_region = region.into();
        a
    }

    #[test]
    fn url_credentials_and_region_go_together() {
        let ok = anchor_s3(&args(
            Some("http://127.0.0.1:9000/bkt/p"),
            Some("/c"),
            "eu-west-1",
        ))
        .unwrap()
        .unwrap();
        assert_eq!(
            (ok.location.bucket.as_str(), ok.location.prefix.as_str()),
            ("bkt", "p")
        );
        assert!(anchor_s3(&args(None, None, "us-east-1")).unwrap().is_none());
        assert!(matches!(
            anchor_s3(&args(Some("http://127.0.0.1:9000/bkt"), None, "us-east-1")),
            Err(AnchorS3Error::NoCredentials)
        ));
        assert!(matches!(
            anchor_s3(&args(None, Some("/c"), "us-east-1")),
            Err(AnchorS3Error::NoUrl)
        ));
        assert!(matches!(
            anchor_s3(&args(Some("http://10.1.1.1/bkt"), Some("/c"), "us-east-1")),
            Err(AnchorS3Error::Url(_))
        ));
        // A CA file: only with an https:// URL.
        let with_ca = |url: Option<&str>, creds: Option<&str>| {
            let mut a = args(url, creds, "us-east-1");
            a.anchor_s3_ca_file = Some("/ca.pem".into());
            anchor_s3(&a)
        };
        let ok = with_ca(Some("https://s3.corp:9000/bkt"), Some("/c"))
            .unwrap()
            .unwrap();
        assert_eq!(ok.ca_file.as_deref(), Some(std::path::Path::new("/ca.pem")));
        assert!(matches!(
            with_ca(None, None),
            Err(AnchorS3Error::CaWithoutUrl)
        ));
        assert!(matches!(
            with_ca(Some("http://127.0.0.1:9000/bkt"), Some("/c")),
            Err(AnchorS3Error::CaWithoutTls)
        ));
        let at_cap = "a".repeat(MAX_REGION_BYTES);
        assert!(anchor_s3(&args(None, None, &at_cap)).is_ok());
        for bad in ["", "US-EAST-1", "a b", &"a".repeat(MAX_REGION_BYTES + 1)] {
            assert!(
                matches!(
                    anchor_s3(&args(None, None, bad)),
                    Err(AnchorS3Error::Region(_))
                ),
                "{bad}"
            );
        }
    }
}

#[cfg(test)]
mod anchor_hook_tests {
    use super::parse_anchor_hook;

    #[test]
    fn argv_from_json() {
        assert_eq!(
            parse_anchor_hook(r#"["/bin/worm","--b","x y"]"#).unwrap(),
            vec!["/bin/worm", "--b", "x y"]
        );
        for bad in [
            "",
            "[]",
            "\"/bin/worm\"",
            r#"["worm"]"#,
            r#"[1]"#,
            r#"["/bin/a\u0000"]"#,
        ] {
            assert!(parse_anchor_hook(bad).is_err(), "{bad}");
        }
    }
}
