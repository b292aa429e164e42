use clap::Parser;

#[derive(Parser)]
#[command(name = "hatcheryd", about = "Hatchery sandbox daemon", version)]
struct Cli {
    #[command(flatten)]
    args: hatcheryd::DaemonArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    hatcheryd::init_logging(cli.args.log_json);
    hatcheryd::run(cli.args).await?;
    Ok(())
}
