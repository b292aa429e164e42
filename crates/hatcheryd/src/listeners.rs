//! The daemon's two listeners (the API's and the preview's) and how both
//! are served until SIGTERM, for either role.

use crate::DaemonError;
use hatchery_config::DaemonArgs;
use hatchery_serve::origin_guard;

/// The preview listener (`--preview-listen`, default the API's port + 1).
pub async fn bind_preview(args: &DaemonArgs) -> Result<tokio::net::TcpListener, DaemonError> {
    let addr = origin_guard::preview_addr(args.listen, args.preview_listen)
        .ok_or(DaemonError::NoPreviewPort(args.listen.port()))?;
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| DaemonError::Listen(addr, e))
}

pub fn local_addr(l: &tokio::net::TcpListener) -> String {
    l.local_addr().map(|a| a.to_string()).unwrap_or_default()
}

pub fn local_port(l: &tokio::net::TcpListener) -> u16 {
    l.local_addr().map(|a| a.port()).unwrap_or(0)
}

/// Both listeners until SIGTERM; each drains its requests for up to the
/// stop grace (`--stop-grace`).
pub async fn serve_both(
    api: tokio::net::TcpListener,
    app: axum::Router,
    preview: tokio::net::TcpListener,
    preview_app: axum::Router,
    args: &DaemonArgs,
) -> Result<(), DaemonError> {
    serve_both_until(api, app, preview, preview_app, args, shutdown_signal()).await
}

/// Both listeners until `stop` completes (a host: SIGTERM, then its
/// sessions moved away while it still listened); then each drains its
/// requests in flight for up to the stop grace.
pub async fn serve_both_until(
    api: tokio::net::TcpListener,
    app: axum::Router,
    preview: tokio::net::TcpListener,
    preview_app: axum::Router,
    args: &DaemonArgs,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), DaemonError> {
    let drain = Some(std::time::Duration::from_secs(args.stop_grace));
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        stop.await;
        let _ = tx.send(true);
    });
    let closed = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|v| *v).await;
    };
    let (a, p) = tokio::join!(
        hatchery_serve::serve(api, app, args.http.clone(), closed(rx.clone()), drain),
        hatchery_serve::serve(preview, preview_app, args.http.clone(), closed(rx), drain),
    );
    a.and(p).map_err(DaemonError::Serve)
}

pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

/// With `--metrics-token-file`, `GET /metrics` also opens to that token
/// (hatchery_serve::metrics_token); `render` is this role's metrics text.
pub fn with_metrics_token(
    app: axum::Router,
    args: &DaemonArgs,
    render: std::sync::Arc<dyn Fn() -> String + Send + Sync>,
) -> Result<axum::Router, DaemonError> {
    use hatchery_serve::metrics_token::{answer, load, MetricsToken};
    let Some(path) = &args.metrics_token_file else {
        return Ok(app);
    };
    let token = load(path)?;
    tracing::info!(path = %path.display(), "GET /metrics also opens to the metrics token");
    Ok(app.layer(axum::middleware::from_fn_with_state(
        MetricsToken {
            token: token.into(),
            render,
        },
        answer,
    )))
}
