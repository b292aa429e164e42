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
        routes::router(app.clone()),
        cfg.http.clone(),
        shutdown(),
        None,
    )
    .await
    .context("server failed")?;
    // A run outlives its visitor's connection (it is a task of its own, so
    // a visitor who leaves still gets the sandbox deleted): the server's
    // end is not the runs' end. Exiting now would drop a cancelled run's
    // delete half-way and leave its sandbox to the TTL.
    let bound = app.limits.timeout + 3 * hatchery_playground::app::DAEMON_CALL_TIMEOUT;
    if app.in_flight.drain(bound).await {
        tracing::info!("stopped");
    } else {
        tracing::warn!(
            in_flight = app.in_flight.current(),
            "stopped with runs still in flight; their sandboxes are left to the TTL"
        );
    }
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
