//! `hatchery`: the command line. Today it carries `serve` (the daemon);
//! client commands (sandbox, exec, cp, template, snapshot) are tracked
//! separately.

use clap::{Parser, Subcommand};

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
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::Serve(args) => {
            hatcheryd::init_logging(args.log_json);
            hatcheryd::run(args).await?;
        }
    }
    Ok(())
}
