//! `hatchery template build|ls|get|rm|build-local`.

use crate::client::{event_error, Api};
use crate::output::{self, s};
use anyhow::{bail, Context};
use clap::Subcommand;
use hatchery_templates::{build_rootfs, default_mirror, BuildPriority, TemplateSpec, Templates};
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Subcommand)]
pub enum TemplateCmd {
    /// Build (or rebuild) a template on the daemon from a spec file,
    /// showing progress until it is done; prints the new version.
    Build {
        /// Template spec (JSON, the body of POST /v1/templates).
        spec: PathBuf,
    },
    /// List templates.
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Show one template.
    Get {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Delete a template (refused while sandboxes or snapshots use it).
    Rm { name: String },
    /// Build a template's rootfs from a spec file and make it current, on
    /// this host, as root. The daemon bakes its checkpoint (files, setup,
    /// warm-up) on first use. Does nothing if that version is already
    /// current.
    BuildLocal {
        #[arg(
            long,
            env = "HATCHERY_TEMPLATES_DIR",
            default_value = "/var/lib/hatchery/templates"
        )]
        templates_dir: PathBuf,
        /// Template spec (JSON, the body of POST /v1/templates).
        spec: PathBuf,
    },
}

pub fn run(api: &Api, cmd: TemplateCmd) -> anyhow::Result<i32> {
    match cmd {
        TemplateCmd::Build { spec } => build(api, &spec)?,
        TemplateCmd::Ls { json } => {
            let list = api.get("/v1/templates")?;
            if json {
                output::json(&list["templates"]);
            } else {
                let rows: Vec<Vec<String>> = list["templates"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|t| {
                        vec![
                            s(&t["name"]),
                            s(&t["version"]),
                            s(&t["cpus"]),
                            s(&t["memory_mb"]),
                            packages(&t["packages"]),
                            if t["checkpoint_ready"] == true {
                                "yes"
                            } else {
                                "no"
                            }
                            .into(),
                            state(t),
                        ]
                    })
                    .collect();
                output::table(
                    &[
                        "NAME",
                        "VERSION",
                        "CPUS",
                        "MEMORY_MB",
                        "PACKAGES",
                        "CHECKPOINT",
                        "STATE",
                    ],
                    &rows,
                );
            }
        }
        TemplateCmd::Get { name, json } => {
            let t = api.get(&format!("/v1/templates/{name}"))?;
            if json {
                output::json(&t);
            } else {
                for k in [
                    "name",
                    "version",
                    "base",
                    "cpus",
                    "memory_mb",
                    "pids_max",
                    "disk_mb",
                ] {
                    println!("{:<17} {}", format!("{k}:"), s(&t[k]));
                }
                println!("{:<17} {}", "packages:", packages(&t["packages"]));
                println!("{:<17} {}", "checkpoint_ready:", t["checkpoint_ready"]);
                println!("{:<17} {}", "state:", state(&t));
                if let Some(url) = t["build"]["events_url"].as_str() {
                    println!("{:<17} {url}", "build_events:");
                }
            }
        }
        TemplateCmd::Rm { name } => {
            api.delete(&format!("/v1/templates/{name}"))?;
            println!("{name}");
        }
        TemplateCmd::BuildLocal {
            templates_dir,
            spec,
        } => build_local(&templates_dir, &spec)?,
    }
    Ok(0)
}

/// `ready`, or the build in progress: `building 60% setup` (a template
/// only being built), `ready, building 60% setup` (a new version of one).
fn state(t: &Value) -> String {
    let st = s(&t["state"]);
    let b = &t["build"];
    if b.is_null() {
        return st;
    }
    let building = format!("building {}% {}", b["percent"], s(&b["step"]));
    if st == "building" {
        building
    } else {
        format!("{st}, {building}")
    }
}

fn packages(v: &Value) -> String {
    let p: Vec<String> = v.as_array().into_iter().flatten().map(s).collect();
    if p.is_empty() {
        "-".into()
    } else {
        p.join(",")
    }
}

pub(crate) fn bar(step: &str, percent: u64) {
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
fn build(api: &Api, spec: &Path) -> anyhow::Result<()> {
    let raw = std::fs::read(spec).with_context(|| format!("reading {}", spec.display()))?;
    let body: Value = serde_json::from_slice(&raw).context("spec is not JSON")?;
    let accepted = api.send("POST", "/v1/templates", &body)?;
    let events = accepted["events_url"]
        .as_str()
        .context("no events_url in answer")?;
    eprintln!(
        "building {} version {}",
        accepted["name"], accepted["version"]
    );
    let (mut step, mut percent) = ("queued".to_string(), 0u64);
    for ev in api.events("GET", events, None)? {
        let ev = ev?;
        match ev.name.as_str() {
            "step" => {
                step = s(&ev.data["step"]);
                percent = ev.data["percent"].as_u64().unwrap_or(percent);
            }
            "done" => {
                bar("done", 100);
                eprintln!();
                println!("{}", s(&ev.data["version"]));
                return Ok(());
            }
            "error" => {
                eprintln!();
                bail!("build failed: {:#}", event_error(&ev.data));
            }
            _ => {}
        }
        bar(&step, percent);
    }
    eprintln!();
    bail!("the event stream ended before the build did")
}

fn build_local(dir: &Path, spec_path: &Path) -> anyhow::Result<()> {
    let raw =
        std::fs::read(spec_path).with_context(|| format!("reading {}", spec_path.display()))?;
    let spec: TemplateSpec =
        serde_json::from_slice(&raw).with_context(|| format!("parsing {}", spec_path.display()))?;
    spec.validate()?;
    let templates = Templates::new(dir);
    if templates
        .get(&spec.name)
        .is_ok_and(|t| t.version == spec.version())
    {
        return Ok(());
    }
    // Layout of the first releases: a bare rootfs/ and template.json.
    let legacy = dir.join(&spec.name);
    let _ = std::fs::remove_dir_all(legacy.join("rootfs"));
    let _ = std::fs::remove_file(legacy.join("template.json"));
    let dest = templates.rootfs_dir(&spec);
    eprintln!(
        "hatchery: building template {} ({}) in {} (debootstrap, about a minute)",
        spec.name,
        spec.version(),
        dest.display()
    );
    let mut n: u32 = 0;
    build_rootfs(
        &spec,
        &dest,
        &default_mirror(),
        BuildPriority::Normal,
        &mut |line| {
            n += 1;
            if n.is_multiple_of(25) || line.starts_with("E:") {
                eprintln!("  {line}");
            }
        },
    )?;
    let t = templates.activate(&spec)?;
    eprintln!(
        "hatchery: template {} version {} is current",
        t.spec.name, t.version
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_state_column_shows_a_build_in_progress() {
        assert_eq!(state(&json!({"state": "ready", "build": null})), "ready");
        let b = json!({"percent": 60, "step": "setup"});
        assert_eq!(
            state(&json!({"state": "building", "build": b})),
            "building 60% setup"
        );
        assert_eq!(
            state(&json!({"state": "ready", "build": b})),
            "ready, building 60% setup"
        );
    }
}
