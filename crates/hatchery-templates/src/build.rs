//! Building a template's root filesystem: debootstrap of the base plus the
//! spec's packages, from the Debian mirror the host already uses. Runs on
//! the host, as root, into a private directory; nothing of the spec but
//! validated package names reaches the command line.

use crate::spec::TemplateSpec;
use crate::TemplateError;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

/// The first `URIs:` of the host's Debian sources, else deb.debian.org.
pub fn default_mirror() -> String {
    std::fs::read_to_string("/etc/apt/sources.list.d/debian.sources")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("URIs:").map(|u| u.trim().to_string()))
        })
        .unwrap_or_else(|| "http://deb.debian.org/debian".to_string())
}

/// Makes `dest` (if not already complete), reporting progress lines to
/// `log`. A crash mid-build leaves only `dest.partial`, never a `dest` that
/// looks finished.
pub fn build_rootfs(
    spec: &TemplateSpec,
    dest: &Path,
    mirror: &str,
    log: &mut dyn FnMut(&str),
) -> Result<(), TemplateError> {
    if dest.join(".complete").exists() {
        log("rootfs already built for these packages; reusing it");
        return Ok(());
    }
    spec.validate()?;
    let io = |e: std::io::Error| TemplateError::Io(e.to_string());
    let partial = dest.with_extension("partial");
    let _ = std::fs::remove_dir_all(&partial);
    if let Some(parent) = dest.parent() {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    let (reader, writer) = std::io::pipe().map_err(io)?;
    let mut cmd = Command::new("debootstrap");
    cmd.arg("--variant=minbase")
        .arg(format!("--include={}", spec.all_packages().join(",")))
        .arg("bookworm")
        .arg(&partial)
        .arg(mirror)
        .stdin(Stdio::null())
        .stdout(writer.try_clone().map_err(io)?)
        .stderr(writer);
    let mut child = cmd
        .spawn()
        .map_err(|e| TemplateError::Io(format!("debootstrap: {e}")))?;
    // Our copies of the pipe's write end must go, or EOF never comes.
    drop(cmd);
    let mut tail = Vec::new();
    for line in BufReader::new(reader).lines().map_while(Result::ok) {
        log(&line);
        tail.push(line);
        if tail.len() > 5 {
            tail.remove(0);
        }
    }
    let status = child.wait().map_err(io)?;
    if !status.success() {
        let _ = std::fs::remove_dir_all(&partial);
        return Err(TemplateError::Build(format!(
            "debootstrap failed ({status}): {}",
            tail.join(" | ")
        )));
    }
    // What a sandbox never needs: apt caches and docs.
    for d in [
        "var/cache/apt/archives",
        "var/lib/apt/lists",
        "usr/share/doc",
        "usr/share/man",
    ] {
        let p = partial.join(d);
        let _ = std::fs::remove_dir_all(&p);
        let _ = std::fs::create_dir_all(&p);
    }
    for d in ["opt/hatchery", "workspace"] {
        std::fs::create_dir_all(partial.join(d)).map_err(io)?;
    }
    std::fs::write(partial.join(".complete"), spec.rootfs_key()).map_err(io)?;
    let _ = std::fs::remove_dir_all(dest);
    std::fs::rename(&partial, dest).map_err(io)?;
    Ok(())
}
