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

/// Both listeners until SIGTERM; each drains its requests for up to 30 s.
pub async fn serve_both(
    api: tokio::net::TcpListener,
    app: axum::Router,
    preview: tokio::net::TcpListener,
    preview_app: axum::Router,
    args: &DaemonArgs,
) -> Result<(), DaemonError> {
    let drain = Some(std::time::Duration::from_secs(30));
    let (a, p) = tokio::join!(
        hatchery_serve::serve(api, app, args.http.clone(), shutdown_signal(), drain),
        hatchery_serve::serve(
            preview,
            preview_app,
            args.http.clone(),
            shutdown_signal(),
            drain
        ),
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
