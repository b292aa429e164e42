//! Command-line flags and environment variables. Every knob has a default
//! that is safe for a public docs site; docs/playground.md lists them all.

use clap::Parser;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "bad --template {0:?}: want NAME or NAME=RUNNER with RUNNER one of python, python-exec, sh"
    )]
    Template(String),
    #[error("bad --trusted-proxy {0:?}: want an IP address or CIDR such as 10.0.0.0/8")]
    Proxy(String),
    #[error("HATCHERY_URL must be http://HOST:PORT (got {0:?})")]
    DaemonUrl(String),
}

#[derive(Parser, Debug, Clone)]
#[command(
    name = "hatchery-playground",
    version,
    about = "Anonymous Run-button gateway for docs sites"
)]
pub struct Config {
    /// Address to listen on.
    #[arg(
        long,
        env = "HATCHERY_PLAYGROUND_LISTEN",
        default_value = "127.0.0.1:7424"
    )]
    pub listen: SocketAddr,
    /// The daemon's base URL (plain http; keep it on loopback or a private network).
    #[arg(long, env = "HATCHERY_URL", default_value = "http://127.0.0.1:7423")]
    pub daemon_url: String,
    /// The daemon's API key. Never sent to visitors.
    #[arg(long, env = "HATCHERY_API_KEY", hide_env_values = true)]
    pub api_key: String,
    /// Runs table (SQLite).
    #[arg(long, env = "HATCHERY_PLAYGROUND_DB", default_value = "playground.db")]
    pub db: PathBuf,
    /// Templates visitors may run, as NAME or NAME=RUNNER: python (run_code in the
    /// sandbox's interpreter), python-exec (a file run with python3), sh. Repeatable.
    #[arg(
        long = "template",
        env = "HATCHERY_PLAYGROUND_TEMPLATES",
        value_delimiter = ',',
        default_value = "code-interpreter=python"
    )]
    pub templates: Vec<String>,
    /// Largest snippet accepted, in bytes.
    #[arg(
        long,
        env = "HATCHERY_PLAYGROUND_MAX_CODE_BYTES",
        default_value_t = 16384
    )]
    pub max_code_bytes: usize,
    /// Runs per minute per client IP (token bucket refill rate).
    #[arg(long, env = "HATCHERY_PLAYGROUND_IP_PER_MINUTE", default_value_t = 6.0)]
    pub ip_per_minute: f64,
    /// Bucket size per client IP (the burst allowed after a quiet spell).
    #[arg(long, env = "HATCHERY_PLAYGROUND_IP_BURST", default_value_t = 6.0)]
    pub ip_burst: f64,
    /// Runs per minute per session cookie.
    #[arg(
        long,
        env = "HATCHERY_PLAYGROUND_SESSION_PER_MINUTE",
        default_value_t = 6.0
    )]
    pub session_per_minute: f64,
    /// Bucket size per session cookie.
    #[arg(long, env = "HATCHERY_PLAYGROUND_SESSION_BURST", default_value_t = 6.0)]
    pub session_burst: f64,
    /// Proxies whose X-Forwarded-For is believed (IP or CIDR). Repeatable. None by default.
    #[arg(
        long = "trusted-proxy",
        env = "HATCHERY_PLAYGROUND_TRUSTED_PROXIES",
        value_delimiter = ','
    )]
    pub trusted_proxies: Vec<String>,
    /// Runs allowed at once, across all visitors; more get 503.
    #[arg(long, env = "HATCHERY_PLAYGROUND_MAX_IN_FLIGHT", default_value_t = 40)]
    pub max_in_flight: usize,
    /// Wall-clock cap on a snippet's run, in seconds (enforced by the gateway).
    #[arg(
        long = "timeout",
        env = "HATCHERY_PLAYGROUND_TIMEOUT",
        default_value_t = 10.0
    )]
    pub timeout_seconds: f64,
    /// Sandbox TTL: the daemon destroys the sandbox after this even if the gateway dies
    /// (raised to the time limit + 10 s if lower).
    #[arg(long = "ttl", env = "HATCHERY_PLAYGROUND_TTL", default_value_t = 60)]
    pub ttl_seconds: u64,
    /// Output per stream (stdout, stderr) before the run is stopped, in bytes.
    #[arg(
        long,
        env = "HATCHERY_PLAYGROUND_MAX_OUTPUT_BYTES",
        default_value_t = 32768
    )]
    pub max_output_bytes: usize,
    /// Result cache: most entries kept.
    #[arg(
        long,
        env = "HATCHERY_PLAYGROUND_CACHE_ENTRIES",
        default_value_t = 1024
    )]
    pub cache_entries: usize,
    /// Result cache: most bytes of output kept, all entries together.
    #[arg(long, env = "HATCHERY_PLAYGROUND_CACHE_BYTES", default_value_t = 32 << 20)]
    pub cache_bytes: usize,
    /// How long a looked-up template version is trusted before asking the daemon again, in seconds.
    #[arg(
        long,
        env = "HATCHERY_PLAYGROUND_TEMPLATE_REFRESH",
        default_value_t = 10
    )]
    pub template_refresh_seconds: u64,
    /// Origins allowed to call the gateway from the browser (CORS). `*` allows any. Repeatable.
    #[arg(
        long = "allow-origin",
        env = "HATCHERY_PLAYGROUND_ALLOW_ORIGINS",
        value_delimiter = ','
    )]
    pub allow_origins: Vec<String>,
    /// Salt for hashing client IPs in the runs table. Random per start when unset.
    #[arg(long, env = "HATCHERY_PLAYGROUND_IP_SALT", hide_env_values = true)]
    pub ip_salt: Option<String>,
    /// Runs older than this many days are deleted from the runs table.
    #[arg(long, env = "HATCHERY_PLAYGROUND_RETENTION_DAYS", default_value_t = 30)]
    pub retention_days: u64,
    /// HTTP connection limits (timeouts, caps in total and per peer), the
    /// same flags as the daemon's.
    #[command(flatten)]
    pub http: hatchery_serve::HttpLimits,
}

impl Config {
    pub fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.timeout_seconds.clamp(0.1, 3600.0))
    }
}

/// How a template's snippet runs. Visitor input never meets a shell: it is
/// either the body of a run_code call or a file started with a fixed argv.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Runner {
    /// The daemon's run_code (`POST /v1/sandboxes/{id}/code/stream`): the
    /// snippet goes to the interpreter already running in the sandbox, so
    /// no file is written and no process is started.
    Code { language: &'static str },
    /// The snippet written to `path`, then `argv` run with the exec API.
    File {
        path: &'static str,
        argv: &'static [&'static str],
    },
}

/// Python through run_code (the default).
pub const PYTHON: Runner = Runner::Code { language: "python" };
/// Python as a file started with `python3 -u` (how every Python snippet ran
/// before run_code; for a daemon or template without it).
pub const PYTHON_EXEC: Runner = Runner::File {
    path: "/workspace/main.py",
    argv: &["python3", "-u", "/workspace/main.py"],
};
pub const SH: Runner = Runner::File {
    path: "/workspace/main.sh",
    argv: &["sh", "/workspace/main.sh"],
};

/// Parses `NAME` (python) or `NAME=python|python-exec|sh`.
pub fn parse_template(spec: &str) -> Result<(String, Runner), ConfigError> {
    let (name, runner) = match spec.split_once('=') {
        Some((n, r)) => (n.trim(), r.trim()),
        None => (spec.trim(), "python"),
    };
    let valid_name = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    let runner = match runner {
        "python" => PYTHON,
        "python-exec" => PYTHON_EXEC,
        "sh" => SH,
        _ => return Err(ConfigError::Template(spec.into())),
    };
    if !valid_name {
        return Err(ConfigError::Template(spec.into()));
    }
    Ok((name.to_string(), runner))
}

/// An address block: a single IP is a /32 (or /128).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    pub fn parse(s: &str) -> Result<Cidr, ConfigError> {
        let bad = || ConfigError::Proxy(s.into());
        let (a, p) = match s.trim().split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s.trim(), None),
        };
        let addr: IpAddr = a.parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            Some(p) => p.parse::<u8>().map_err(|_| bad())?,
            None => max,
        };
        if prefix > max {
            return Err(bad());
        }
        Ok(Cidr { addr, prefix })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX.checked_shl(32 - self.prefix as u32).unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX.checked_shl(128 - self.prefix as u32).unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// IPv4-mapped IPv6 addresses (from a dual-stack listener) count as IPv4.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

/// `http://host:port` without a path; the client speaks plain HTTP/1.1.
pub fn parse_daemon_url(url: &str) -> Result<String, ConfigError> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| ConfigError::DaemonUrl(url.into()))?
        .trim_end_matches('/');
    if rest.is_empty() || rest.contains('/') {
        return Err(ConfigError::DaemonUrl(url.into()));
    }
    Ok(if rest.contains(':') {
        rest.to_string()
    } else {
        format!("{rest}:80")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates() {
        assert_eq!(parse_template("code-interpreter").unwrap().1, PYTHON);
        assert_eq!(parse_template("shell=sh").unwrap(), ("shell".into(), SH));
        assert_eq!(parse_template("py=python").unwrap().1, PYTHON);
        assert_eq!(parse_template("py=python-exec").unwrap().1, PYTHON_EXEC);
        assert!(parse_template("x=ruby").is_err());
        assert!(parse_template("Bad").is_err());
        assert!(parse_template("=python").is_err());
    }

    #[test]
    fn cidrs() {
        let c = Cidr::parse("10.0.0.0/8").unwrap();
        assert!(c.contains("10.1.2.3".parse().unwrap()));
        assert!(!c.contains("11.0.0.1".parse().unwrap()));
        assert!(c.contains("::ffff:10.0.0.1".parse().unwrap()));
        let one = Cidr::parse("127.0.0.1").unwrap();
        assert!(one.contains("127.0.0.1".parse().unwrap()));
        assert!(!one.contains("127.0.0.2".parse().unwrap()));
        assert!(Cidr::parse("0.0.0.0/0")
            .unwrap()
            .contains("8.8.8.8".parse().unwrap()));
        assert!(Cidr::parse("1.2.3.4/33").is_err());
        assert!(Cidr::parse("nope").is_err());
        assert!(Cidr::parse("::1").unwrap().contains("::1".parse().unwrap()));
    }

    #[test]
    fn daemon_url() {
        assert_eq!(
            parse_daemon_url("http://127.0.0.1:7423/").unwrap(),
            "127.0.0.1:7423"
        );
        assert_eq!(
            parse_daemon_url("http://localhost").unwrap(),
            "localhost:80"
        );
        assert!(parse_daemon_url("https://x").is_err());
        assert!(parse_daemon_url("http://x/y").is_err());
    }
}
