//! Talking to a running daemon: where it is, the key, and turning every
//! failure into a message that says what to do next. The HTTP itself is
//! hatchery-client's (its blocking facade: the CLI does one thing at a
//! time, from `spawn_blocking`).

use anyhow::bail;
use clap::Args;
use hatchery_client::blocking::BlockingClient;
use hatchery_client::{Client, ClientConfig, ClientError, Method};
use serde_json::Value;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

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
    /// The client, made on first use (the key is read then).
    #[arg(skip)]
    client: Arc<OnceLock<Arc<BlockingClient>>>,
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

    /// The blocking client of this daemon.
    fn blocking(&self) -> anyhow::Result<&Arc<BlockingClient>> {
        if let Some(c) = self.client.get() {
            return Ok(c);
        }
        let c = Client::with_config(&self.url, &self.key()?, cli_config()).map_err(|e| {
            anyhow::anyhow!(
                "{e}. Point HATCHERY_URL / --url at the daemon, e.g. http://127.0.0.1:7423"
            )
        })?;
        let c = Arc::new(BlockingClient::new(c)?);
        Ok(self.client.get_or_init(|| c))
    }

    /// The typed client, to build a call for `run`.
    pub fn c(&self) -> anyhow::Result<&Client> {
        Ok(self.blocking()?.client())
    }

    /// Runs one call of the typed client, with the CLI's explanations of
    /// what failed: `api.run(api.c()?.get_sandbox(id))`.
    pub fn run<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, ClientError>>,
    ) -> anyhow::Result<T> {
        self.blocking()?
            .run(call)
            .map_err(|e| explain(&self.url, e))
    }

    fn method(m: &str) -> anyhow::Result<Method> {
        Method::from_bytes(m.as_bytes()).map_err(|e| anyhow::anyhow!("bad method {m}: {e}"))
    }

    pub fn get(&self, path: &str) -> anyhow::Result<Value> {
        self.run(self.c()?.request_json(Method::GET, path, None))
    }

    /// A JSON request that answers JSON (or nothing, for 204).
    pub fn send(&self, method: &str, path: &str, body: &Value) -> anyhow::Result<Value> {
        let m = Self::method(method)?;
        self.run(self.c()?.request_json(m, path, Some(body)))
    }

    /// A request without a body that answers JSON (or nothing, for 204).
    pub fn call(&self, method: &str, path: &str) -> anyhow::Result<Value> {
        let m = Self::method(method)?;
        self.run(self.c()?.request_json(m, path, None))
    }

    pub fn delete(&self, path: &str) -> anyhow::Result<()> {
        self.run(self.c()?.request_bytes(Method::DELETE, path, None))
            .map(drop)
    }

    /// Uploads a file. The daemon answers 413 from the Content-Length alone
    /// and may close the connection before reading the body, so the answer
    /// can be lost in a broken pipe; if the daemon is up, that is what
    /// happened.
    pub fn upload(&self, id: &str, path: &str, data: Vec<u8>) -> anyhow::Result<()> {
        let len = data.len();
        let b = self.blocking()?;
        match b.run(b.client().write_file(id, path, data)) {
            Ok(()) => Ok(()),
            Err(e @ ClientError::Http { .. }) if b.run(b.client().health()).is_ok() => {
                Err(anyhow::anyhow!(
                    "the daemon closed the connection without reading the {len} byte upload ({e}); it \
                     does that for bodies over its --max-file-bytes limit (too_large)"
                ))
            }
            Err(e) => Err(explain(&self.url, e)),
        }
    }

    /// Opens a server-sent event stream (POST with a body, or GET).
    pub fn events(&self, method: &str, path: &str, body: Option<&Value>) -> anyhow::Result<Events> {
        let m = Self::method(method)?;
        let stream = self.run(self.c()?.request_events(m, path, body))?;
        Ok(Events {
            client: self.blocking()?.clone(),
            stream,
            url: self.url.clone(),
        })
    }
}

/// The CLI waits as long as the commands it runs may: the daemon's longest
/// exec timeout (3600 s) and then some. Streams are bounded by the idle
/// timeout between the daemon's keep-alives instead.
fn cli_config() -> ClientConfig {
    ClientConfig::default()
        .call_timeout(Duration::from_secs(3600 + 60))
        .max_json_bytes(64 << 20)
        .max_file_bytes(1 << 30)
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

fn explain(url: &str, e: ClientError) -> anyhow::Error {
    match e {
        ClientError::Api {
            status,
            code,
            message,
            ..
        } => ApiError {
            status,
            code,
            message,
        }
        .into(),
        ClientError::Connect { source, .. } => anyhow::anyhow!(
            "cannot reach the daemon at {url} ({source}). Start it with `make run` or `hatchery serve`, \
             or point HATCHERY_URL / --url at a running one."
        ),
        e => e.into(),
    }
}

/// One server-sent event: its name and its JSON data.
pub struct Event {
    pub name: String,
    pub data: Value,
}

pub struct Events {
    client: Arc<BlockingClient>,
    stream: hatchery_client::EventStream,
    url: String,
}

impl Iterator for Events {
    type Item = anyhow::Result<Event>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.client.run(self.stream.next()) {
            Ok(Some(ev)) => Some(Ok(Event {
                data: ev.json(),
                name: ev.event,
            })),
            Ok(None) => None,
            Err(e) => Some(Err(explain(&self.url, e))),
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
    Ok(path
        .split('/')
        .map(hatchery_client::encode_component)
        .collect::<Vec<_>>()
        .join("/"))
}
