use anyhow::Context;
use clap::Parser;
use hatchery_playground::app::App;
use hatchery_playground::config::Config;
use hatchery_playground::routes;
use std::sync::Arc;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    let cfg = Config::parse();
    let app = Arc::new(App::new(&cfg).context("bad configuration")?);
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .with_context(|| format!("cannot listen on {}", cfg.listen))?;
    tracing::info!(listen = %cfg.listen, daemon = %cfg.daemon_url, templates = ?cfg.templates,
                   "hatchery-playground serving");
    // Graceful: in-flight runs finish (each is bounded by the wall-clock cap)
    // and delete their sandboxes before the process exits. The serve loop
    // puts each connection's peer address where ConnectInfo finds it.
    hatchery_serve::serve(
        listener,
        routes::router(app),
        cfg.http.clone(),
        shutdown(),
        None,
    )
    .await
    .context("server failed")?;
    tracing::info!("stopped");
    Ok(())
}

async fn shutdown() {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("shutting down; waiting for runs in flight");
}
