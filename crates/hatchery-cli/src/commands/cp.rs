//! `hatchery cp SRC DST`: one side is `ID:/path` in a sandbox, the other a
//! local path or `-` (stdin/stdout). Bytes are copied as they are.

use crate::client::{api_code, query_path, Api};
use crate::commands::sandbox::get;
use anyhow::{bail, Context};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

pub fn run(api: &Api, src: &str, dst: &str) -> anyhow::Result<i32> {
    match (split_remote(src), split_remote(dst)) {
        (Some(_), Some(_)) => {
            bail!("both sides are in sandboxes; copy through a local file instead")
        }
        (None, None) => bail!(
            "one side must be in a sandbox, written ID:/path (for example sbx_0123456789abcdef:/workspace/main.py)"
        ),
        (None, Some((id, path))) => upload(api, src, id, path),
        (Some((id, path)), None) => download(api, id, path, dst),
    }?;
    Ok(0)
}

fn upload(api: &Api, src: &str, id: &str, path: &str) -> anyhow::Result<()> {
    let data = if src == "-" {
        let mut b = Vec::new();
        std::io::stdin().read_to_end(&mut b)?;
        b
    } else {
        if Path::new(src).is_dir() {
            bail!(
                "{src} is a directory; copy files one at a time (or tar it and copy the archive)"
            );
        }
        std::fs::read(src).with_context(|| format!("reading {src}"))?
    };
    get(api, id)?;
    let mut target = path.trim_end_matches('/').to_string();
    if path.ends_with('/') || is_remote_dir(api, id, &target)? {
        let name = Path::new(src)
            .file_name()
            .filter(|_| src != "-")
            .context("stdin has no name: give the full destination path")?;
        target = format!("{target}/{}", name.to_string_lossy());
    }
    query_path(&target)?;
    api.upload(id, &target, data)
        .with_context(|| format!("writing {id}:{target}"))
}

fn is_remote_dir(api: &Api, id: &str, path: &str) -> anyhow::Result<bool> {
    if path.is_empty() {
        return Ok(true);
    }
    query_path(path)?;
    match api.run(api.c()?.list_files(id, path)) {
        Ok(_) => Ok(true),
        Err(e) if matches!(api_code(&e), Some("file_not_found" | "file_conflict")) => Ok(false),
        Err(e) => Err(e),
    }
}

fn download(api: &Api, id: &str, path: &str, dst: &str) -> anyhow::Result<()> {
    get(api, id)?;
    query_path(path)?;
    let data = match api.run(api.c()?.read_file(id, path)) {
        Ok(d) => d,
        Err(e) => {
            return Err(match api_code(&e) {
                Some("file_not_found") => anyhow::anyhow!("no file {id}:{path}"),
                Some("file_conflict") => anyhow::anyhow!(
                    "{id}:{path} is a directory; copy files one at a time (or tar it in the sandbox first)"
                ),
                _ => e,
            })
        }
    };
    if dst == "-" {
        let mut o = std::io::stdout().lock();
        o.write_all(&data)?;
        return Ok(o.flush()?);
    }
    let mut target = PathBuf::from(dst);
    if dst.ends_with('/') || target.is_dir() {
        let name = Path::new(path)
            .file_name()
            .context("the sandbox path has no file name")?;
        target = target.join(name);
    }
    std::fs::write(&target, &data).with_context(|| format!("writing {}", target.display()))
}

/// Reads `ID:/path`; None when the argument is a local path.
fn split_remote(arg: &str) -> Option<(&str, &str)> {
    let (id, path) = arg.split_once(':')?;
    (id.starts_with("sbx_") && !id.contains('/')).then_some((id, path))
}
