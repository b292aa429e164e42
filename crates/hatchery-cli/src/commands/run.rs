//! `hatchery run FILE`: a fresh sandbox, the file copied in and run, its
//! output streamed, and the sandbox destroyed whatever happens.

use crate::cleanup::create_owned;
use crate::client::{query_path, Api};
use crate::commands::exec::{status, stream, write_chunk};
use crate::output::{kv_map, s};
use anyhow::{bail, Context};
use clap::Args;
use serde_json::json;
use std::io::Read;
use std::path::PathBuf;

#[derive(Args)]
pub struct RunArgs {
    /// The program: .py runs with python3, .sh with sh; anything else needs --interpreter.
    pub file: PathBuf,
    /// Template to start from.
    #[arg(long, default_value = "code-interpreter")]
    pub template: String,
    /// Command that runs the file (for example `python3 -u`).
    #[arg(long)]
    pub interpreter: Option<String>,
    /// Seconds before the program is killed (daemon default 60, max 3600).
    #[arg(long, short = 't')]
    pub timeout: Option<u64>,
    /// KEY=VALUE for the program, repeatable.
    #[arg(long = "env", short = 'e', value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Send our stdin to the program (read to the end first; at most 1 MiB of UTF-8).
    #[arg(long, short = 'i')]
    pub stdin: bool,
    /// Arguments for the program (after `--`).
    #[arg(last = true)]
    pub args: Vec<String>,
}

pub fn run(api: &Api, a: RunArgs) -> anyhow::Result<i32> {
    let code = std::fs::read(&a.file).with_context(|| format!("reading {}", a.file.display()))?;
    let name = a
        .file
        .file_name()
        .context("the file has no name")?
        .to_string_lossy()
        .into_owned();
    let interp: Vec<String> = match (&a.interpreter, a.file.extension().and_then(|e| e.to_str())) {
        (Some(i), _) => i.split_whitespace().map(str::to_string).collect(),
        (None, Some("py")) => vec!["python3".into(), "-u".into()],
        (None, Some("sh")) => vec!["sh".into()],
        _ => bail!(
            "do not know how to run {name}: give --interpreter (for example --interpreter python3)"
        ),
    };
    if interp.is_empty() {
        bail!("--interpreter is empty");
    }
    let mut exec = json!({
        "argv": interp.into_iter().chain([format!("/workspace/{name}")]).chain(a.args).collect::<Vec<_>>(),
        "cwd": "/workspace",
        "env": kv_map(&a.env, "--env")?,
    });
    let mut create = json!({ "template": a.template, "metadata": { "hatchery-run": name } });
    if let Some(t) = a.timeout {
        exec["timeout_seconds"] = t.into();
        // The sandbox must outlive the program, with room for the copy.
        create["ttl_seconds"] = (t + 60).max(300).into();
    }
    if a.stdin {
        let mut buf = Vec::new();
        std::io::stdin().read_to_end(&mut buf)?;
        exec["stdin"] = String::from_utf8(buf)
            .context("--stdin takes UTF-8 text")?
            .into();
    }
    let sbx = create_owned(api, || {
        Ok(s(&api.send("POST", "/v1/sandboxes", &create)?["id"]))
    })?;
    let path = query_path(&format!("/workspace/{name}"))?;
    api.put_bytes(
        &format!("/v1/sandboxes/{}/files?path={path}", sbx.id),
        &code,
    )
    .context("copying the file in")?;
    let exit = stream(api, &sbx.id, &exec, &mut write_chunk)?;
    Ok(status(&exit, true))
}
