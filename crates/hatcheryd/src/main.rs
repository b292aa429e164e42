use hatchery_config::{ConfigError, Invocation};
use std::process::ExitCode;

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    let args = match hatchery_config::parse(std::env::args_os().collect()) {
        Ok(Invocation::Run(args)) => args,
        Ok(Invocation::Checked(file)) => {
            println!("{}: ok", file.display());
            return Ok(ExitCode::SUCCESS);
        }
        Ok(Invocation::Example(text)) => {
            print!("{text}");
            return Ok(ExitCode::SUCCESS);
        }
        // --help, --version and usage errors, as clap answers them.
        Err(ConfigError::Cli(e)) => e.exit(),
        Err(e) => {
            // With its causes (a TOML syntax error's line and column).
            eprintln!("hatcheryd: configuration: {:#}", anyhow::Error::from(e));
            return Ok(ExitCode::from(2));
        }
    };
    hatcheryd::init_logging(args.log_json);
    hatcheryd::run(*args).await?;
    Ok(ExitCode::SUCCESS)
}
