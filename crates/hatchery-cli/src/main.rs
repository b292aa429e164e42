//! `hatchery`: the command line. `serve` runs the daemon; `template build`
//! builds a template through the daemon with a progress bar; `template
//! build-local` builds a template's root filesystem on this host without a
//! daemon (how `make run` makes the default template). The other client
//! commands (sandbox, exec, cp, snapshot) are tracked separately.

mod client;

use anyhow::Context;
use clap::{Parser, Subcommand};
use hatchery_templates::{build_rootfs, default_mirror, TemplateSpec, Templates};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "hatchery",
    about = "Hatchery: disposable, isolated sandboxes",
    version
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the daemon in the foreground (same as `hatcheryd`).
    Serve(hatcheryd::DaemonArgs),
    /// Templates.
    #[command(subcommand)]
    Template(TemplateCmd),
}

#[derive(Subcommand)]
enum TemplateCmd {
    /// Build (or rebuild) a template on the daemon from a spec file,
    /// showing progress until it is done.
    Build {
        /// Template spec (JSON, the body of POST /v1/templates).
        spec: PathBuf,
        #[command(flatten)]
        api: client::Api,
    },
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::Serve(args) => {
            hatcheryd::init_logging(args.log_json);
            hatcheryd::run(args).await?;
        }
        Cmd::Template(TemplateCmd::BuildLocal {
            templates_dir,
            spec,
        }) => build_local(&templates_dir, &spec)?,
        // Blocking HTTP is fine here: the CLI does one thing at a time.
        Cmd::Template(TemplateCmd::Build { spec, api }) => {
            tokio::task::spawn_blocking(move || client::template_build(&api, &spec)).await??
        }
    }
    Ok(())
}

fn build_local(dir: &std::path::Path, spec_path: &std::path::Path) -> anyhow::Result<()> {
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
    build_rootfs(&spec, &dest, &default_mirror(), &mut |line| {
        n += 1;
        if n.is_multiple_of(25) || line.starts_with("E:") {
            eprintln!("  {line}");
        }
    })?;
    let t = templates.activate(&spec)?;
    eprintln!(
        "hatchery: template {} version {} is current",
        t.spec.name, t.version
    );
    Ok(())
}
