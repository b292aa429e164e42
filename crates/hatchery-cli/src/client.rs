//! Talking to a running daemon.

use anyhow::{bail, Context};
use clap::Args;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;

#[derive(Debug, Clone, Args)]
pub struct Api {
    /// Daemon URL.
    #[arg(long, env = "HATCHERY_URL", default_value = "http://127.0.0.1:7423")]
    pub url: String,
    /// API key (default: read from the local daemon's key file).
    #[arg(long, env = "HATCHERY_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Key file of a local daemon.
    #[arg(long, default_value = "/var/lib/hatchery/api_key")]
    pub key_file: String,
}

impl Api {
    fn key(&self) -> anyhow::Result<String> {
        if let Some(k) = &self.api_key {
            return Ok(k.clone());
        }
        std::fs::read_to_string(&self.key_file)
            .map(|k| k.trim().to_string())
            .with_context(|| format!("no HATCHERY_API_KEY and cannot read {}", self.key_file))
    }

    fn call(&self, req: ureq::Request) -> anyhow::Result<ureq::Response> {
        match req
            .set("Authorization", &format!("Bearer {}", self.key()?))
            .call()
        {
            Ok(r) => Ok(r),
            Err(e) => Err(explain(&self.url, e)),
        }
    }
}

fn explain(url: &str, e: ureq::Error) -> anyhow::Error {
    match e {
        ureq::Error::Status(code, r) => {
            let body = r.into_string().unwrap_or_default();
            let msg = serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
                .unwrap_or(body);
            anyhow::anyhow!("daemon answered {code}: {msg}")
        }
        ureq::Error::Transport(t) => anyhow::anyhow!(
            "cannot reach the daemon at {url} ({t}). Start it with `make run` or `hatchery serve`."
        ),
    }
}

fn bar(step: &str, percent: u64) {
    let filled = (percent.min(100) / 5) as usize;
    eprint!(
        "\r[{}{}] {:>3}% {:<10}",
        "#".repeat(filled),
        "-".repeat(20 - filled),
        percent,
        step
    );
    let _ = std::io::stderr().flush();
}

/// POST /v1/templates, then follow the build's events with a progress bar.
pub fn template_build(api: &Api, spec: &Path) -> anyhow::Result<()> {
    let raw = std::fs::read(spec).with_context(|| format!("reading {}", spec.display()))?;
    let body: serde_json::Value = serde_json::from_slice(&raw).context("spec is not JSON")?;
    let key = api.key()?;
    let accepted: serde_json::Value = ureq::post(&format!("{}/v1/templates", api.url))
        .set("Authorization", &format!("Bearer {key}"))
        .send_json(body)
        .map_err(|e| explain(&api.url, e))?
        .into_json()?;
    let events = accepted["events_url"]
        .as_str()
        .context("no events_url in answer")?;
    eprintln!(
        "building {} version {}",
        accepted["name"], accepted["version"]
    );
    let resp = api.call(ureq::get(&format!("{}{events}", api.url)))?;
    let (mut event, mut step, mut percent) = (String::new(), "queued".to_string(), 0u64);
    for line in BufReader::new(resp.into_reader()).lines() {
        let line = line?;
        if let Some(e) = line.strip_prefix("event:") {
            event = e.trim().to_string();
            continue;
        }
        let Some(data) = line.strip_prefix("data:") else {
            continue;
        };
        let v: serde_json::Value = serde_json::from_str(data.trim()).unwrap_or_default();
        match event.as_str() {
            "step" => {
                step = v["step"].as_str().unwrap_or("").to_string();
                percent = v["percent"].as_u64().unwrap_or(percent);
            }
            "done" => {
                bar("done", 100);
                eprintln!();
                println!("{}", v["version"].as_str().unwrap_or(""));
                return Ok(());
            }
            "error" => {
                eprintln!();
                bail!(
                    "build failed: {}",
                    v["error"]["message"].as_str().unwrap_or("unknown error")
                );
            }
            _ => {}
        }
        bar(&step, percent);
    }
    eprintln!();
    bail!("the event stream ended before the build did")
}
