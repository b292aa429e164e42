//! Talking to a running daemon: where it is, the key, requests, and turning
//! every failure into a message that says what to do next.

use anyhow::{bail, Context};
use clap::Args;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read};

/// Exit status for failures of hatchery itself (daemon unreachable, unknown
/// id, bad request) in `exec` and `run`, where 1..=123 belong to the command.
pub const EXIT_HATCHERY: i32 = 125;
/// Exit status when an exec hit its deadline (as coreutils `timeout`).
pub const EXIT_TIMEOUT: i32 = 124;

#[derive(Debug, Clone, Args)]
pub struct Api {
    /// Daemon URL.
    #[arg(
        long,
        global = true,
        help_heading = "Connection",
        env = "HATCHERY_URL",
        default_value = "http://127.0.0.1:7423"
    )]
    pub url: String,
    /// API key (default: read from the local daemon's key file).
    #[arg(
        long,
        global = true,
        help_heading = "Connection",
        env = "HATCHERY_API_KEY",
        hide_env_values = true
    )]
    pub api_key: Option<String>,
    /// Key file of a local daemon.
    #[arg(
        long,
        global = true,
        help_heading = "Connection",
        env = "HATCHERY_KEY_FILE",
        default_value = "/var/lib/hatchery/api_key"
    )]
    pub key_file: String,
}

impl Api {
    pub(crate) fn key(&self) -> anyhow::Result<String> {
        if let Some(k) = self.api_key.as_ref().filter(|k| !k.is_empty()) {
            return Ok(k.clone());
        }
        std::fs::read_to_string(&self.key_file)
            .map(|k| k.trim().to_string())
            .map_err(|e| {
                anyhow::anyhow!(
                    "no API key: HATCHERY_API_KEY is not set and {} cannot be read ({e}). \
                     Set HATCHERY_API_KEY (or --api-key), or run as a user who can read the key file. \
                     A daemon writes that file on its first start: `make run` or `sudo hatchery serve`.",
                    self.key_file
                )
            })
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.url.trim_end_matches('/'))
    }

    fn request(&self, method: &str, path: &str) -> anyhow::Result<ureq::Request> {
        Ok(ureq::request(method, &self.url(path))
            .set("Authorization", &format!("Bearer {}", self.key()?)))
    }

    fn done(&self, r: Result<ureq::Response, ureq::Error>) -> anyhow::Result<ureq::Response> {
        r.map_err(|e| explain(&self.url, e))
    }

    pub fn get(&self, path: &str) -> anyhow::Result<Value> {
        let r = self.done(self.request("GET", path)?.call())?;
        r.into_json().context("the daemon's answer is not JSON")
    }

    /// A JSON request that answers JSON (or nothing, for 204).
    pub fn send(&self, method: &str, path: &str, body: &Value) -> anyhow::Result<Value> {
        let r = self.done(self.request(method, path)?.send_json(body))?;
        if r.status() == 204 {
            return Ok(Value::Null);
        }
        r.into_json().context("the daemon's answer is not JSON")
    }

    /// A request without a body that answers JSON (or nothing, for 204).
    pub fn call(&self, method: &str, path: &str) -> anyhow::Result<Value> {
        let r = self.done(self.request(method, path)?.call())?;
        if r.status() == 204 {
            return Ok(Value::Null);
        }
        r.into_json().context("the daemon's answer is not JSON")
    }

    /// POSTs raw bytes (`application/octet-stream`); the answer is not read.
    pub fn post_bytes(&self, path: &str, body: &[u8]) -> anyhow::Result<()> {
        let req = self
            .request("POST", path)?
            .set("Content-Type", "application/octet-stream");
        self.done(req.send_bytes(body)).map(drop)
    }

    pub fn delete(&self, path: &str) -> anyhow::Result<()> {
        self.done(self.request("DELETE", path)?.call())?;
        Ok(())
    }

    pub fn put_bytes(&self, path: &str, body: &[u8]) -> anyhow::Result<()> {
        match self.request("PUT", path)?.send_bytes(body) {
            // The daemon answers 413 from the Content-Length alone and
            // closes the connection without reading the body, so the client
            // sees a broken pipe instead of the answer. If the daemon is up,
            // that is what happened.
            Err(ureq::Error::Transport(t)) if self.alive() => Err(anyhow::anyhow!(
                "the daemon closed the connection without reading the {} byte upload ({t}); it does \
                 that for bodies over its --max-file-bytes limit (too_large)",
                body.len()
            )),
            r => self.done(r).map(drop),
        }
    }

    fn alive(&self) -> bool {
        ureq::get(&self.url("/healthz"))
            .timeout(std::time::Duration::from_secs(5))
            .call()
            .is_ok()
    }

    pub fn get_reader(&self, path: &str) -> anyhow::Result<Box<dyn Read + Send + Sync>> {
        Ok(self.done(self.request("GET", path)?.call())?.into_reader())
    }

    /// Opens a server-sent event stream (POST with a body, or GET).
    pub fn events(&self, method: &str, path: &str, body: Option<&Value>) -> anyhow::Result<Events> {
        let req = self.request(method, path)?;
        let r = match body {
            Some(b) => req.send_json(b),
            None => req.call(),
        };
        Ok(Events {
            lines: BufReader::new(self.done(r)?.into_reader()),
        })
    }
}

/// The `code` of an API error, when that is what failed; lets callers turn
/// an expected 404 into their own message.
pub fn api_code(e: &anyhow::Error) -> Option<&str> {
    e.downcast_ref::<ApiError>().map(|a| a.code.as_str())
}

#[derive(Debug)]
pub struct ApiError {
    pub status: u16,
    pub code: String,
    pub message: String,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({} {})", self.message, self.status, self.code)?;
        if self.status == 401 {
            write!(
                f,
                ". The key does not match the daemon's: check HATCHERY_API_KEY / --api-key / --key-file"
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for ApiError {}

fn explain(url: &str, e: ureq::Error) -> anyhow::Error {
    match e {
        ureq::Error::Status(status, r) => {
            let body = r.into_string().unwrap_or_default();
            let v: Value = serde_json::from_str(&body).unwrap_or_default();
            let text = |k: &str| v["error"][k].as_str().map(str::to_string);
            ApiError {
                status,
                code: text("code").unwrap_or_else(|| "unknown".into()),
                message: text("message").unwrap_or(body),
            }
            .into()
        }
        ureq::Error::Transport(t) => anyhow::anyhow!(
            "cannot reach the daemon at {url} ({t}). Start it with `make run` or `hatchery serve`, \
             or point HATCHERY_URL / --url at a running one."
        ),
    }
}

/// One server-sent event: its name and its JSON data.
pub struct Event {
    pub name: String,
    pub data: Value,
}

pub struct Events {
    lines: BufReader<Box<dyn Read + Send + Sync>>,
}

impl Iterator for Events {
    type Item = anyhow::Result<Event>;

    fn next(&mut self) -> Option<Self::Item> {
        let (mut name, mut data) = (String::new(), String::new());
        let mut line = String::new();
        loop {
            line.clear();
            match self.lines.read_line(&mut line) {
                Ok(0) => return None,
                Ok(_) => {}
                Err(e) => return Some(Err(e.into())),
            }
            let l = line.trim_end_matches(['\n', '\r']);
            if l.is_empty() {
                if name.is_empty() && data.is_empty() {
                    continue;
                }
                let data = serde_json::from_str(&data).unwrap_or(Value::Null);
                return Some(Ok(Event { name, data }));
            } else if let Some(e) = l.strip_prefix("event:") {
                name = e.trim().to_string();
            } else if let Some(d) = l.strip_prefix("data:") {
                if !data.is_empty() {
                    data.push('\n');
                }
                data.push_str(d.strip_prefix(' ').unwrap_or(d));
            }
            // Comment lines (":") are keep-alives.
        }
    }
}

/// The message of an `error` event's data.
pub fn event_error(data: &Value) -> anyhow::Error {
    let e = &data["error"];
    anyhow::anyhow!(
        "{} ({})",
        e["message"].as_str().unwrap_or("unknown error"),
        e["code"].as_str().unwrap_or("unknown")
    )
}

/// Percent-encodes a sandbox path for `?path=`.
pub fn query_path(path: &str) -> anyhow::Result<String> {
    if !path.starts_with('/') {
        bail!("sandbox paths are absolute: {path:?} does not start with /");
    }
    let mut out = String::new();
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || b"/-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    Ok(out)
}
