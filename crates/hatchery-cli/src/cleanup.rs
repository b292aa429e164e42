//! Sandboxes this process created and must not leave behind (`hatchery
//! run`): destroyed when their guard drops (success, error, panic) and by
//! the signal handler on Ctrl-C, SIGTERM or SIGHUP.

use crate::client::Api;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

static OWNED: Mutex<Vec<(Api, String)>> = Mutex::new(Vec::new());
/// A create is in flight: a signal now waits for its id rather than leave
/// the new sandbox to its TTL.
static CREATING: AtomicBool = AtomicBool::new(false);
/// A signal came: its handler owns the exit from now on.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Creates a sandbox with `create` and owns it, with no window in which a
/// signal could miss it.
pub fn create_owned(
    api: &Api,
    create: impl FnOnce() -> anyhow::Result<String>,
) -> anyhow::Result<Owned> {
    CREATING.store(true, Ordering::SeqCst);
    let r = create().map(|id| Owned::new(api, id));
    CREATING.store(false, Ordering::SeqCst);
    r
}

/// Destroys the sandbox when dropped.
pub struct Owned {
    api: Api,
    pub id: String,
}

impl Owned {
    fn new(api: &Api, id: String) -> Self {
        OWNED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((api.clone(), id.clone()));
        Owned {
            api: api.clone(),
            id,
        }
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        OWNED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(_, id)| id != &self.id);
        if let Err(e) = self.api.delete(&format!("/v1/sandboxes/{}", self.id)) {
            eprintln!("hatchery: could not destroy sandbox {}: {e:#}", self.id);
        }
    }
}

/// Starts watching SIGINT, SIGTERM and SIGHUP now (so none is missed once
/// this returns); the future destroys every owned sandbox on the first one
/// and exits with 128 + the signal, as the shell would have.
pub fn on_signals() -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut hup = signal(SignalKind::hangup())?;
    Ok(async move {
        let sig = tokio::select! {
            _ = int.recv() => libc::SIGINT,
            _ = term.recv() => libc::SIGTERM,
            _ = hup.recv() => libc::SIGHUP,
        };
        destroy_owned_and_exit(sig).await
    })
}

async fn destroy_owned_and_exit(sig: i32) -> ! {
    INTERRUPTED.store(true, Ordering::SeqCst);
    let since = Instant::now();
    while CREATING.load(Ordering::SeqCst) && since.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let owned: Vec<(Api, String)> =
        std::mem::take(&mut *OWNED.lock().unwrap_or_else(|e| e.into_inner()));
    let _ = tokio::task::spawn_blocking(move || {
        for (api, id) in owned {
            match api.delete(&format!("/v1/sandboxes/{id}")) {
                Ok(()) => eprintln!("\nhatchery: interrupted; destroyed sandbox {id}"),
                Err(e) => eprintln!("\nhatchery: interrupted; could not destroy {id}: {e:#}"),
            }
        }
    })
    .await;
    std::process::exit(128 + sig);
}
