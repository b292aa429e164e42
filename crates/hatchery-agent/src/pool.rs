//! Reusable threads. Creating a thread inside gVisor costs milliseconds
//! (each needs its own host stub context under systrap), and every exec
//! needs three (waiter, stdout and stderr pumps), so threads are parked and
//! reused instead of spawned per command.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, OnceLock};

type Job = Box<dyn FnOnce() + Send>;

struct Pool {
    tx: Mutex<Sender<Job>>,
    rx: Arc<Mutex<Receiver<Job>>>,
    idle: Arc<AtomicUsize>,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let (tx, rx) = channel();
        Pool {
            tx: Mutex::new(tx),
            rx: Arc::new(Mutex::new(rx)),
            idle: Arc::new(AtomicUsize::new(0)),
        }
    })
}

/// Runs `f` on a parked thread, or a new one if none is idle.
pub fn run(f: impl FnOnce() + Send + 'static) {
    let p = pool();
    // Claim an idle worker, or make one that will pick this job up.
    let claimed = p
        .idle
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    if !claimed {
        let (rx, idle) = (Arc::clone(&p.rx), Arc::clone(&p.idle));
        std::thread::spawn(move || loop {
            let job = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
            match job {
                Ok(job) => job(),
                Err(_) => return,
            }
            idle.fetch_add(1, Ordering::SeqCst);
        });
    }
    let _ =
        p.tx.lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(Box::new(f));
}

/// Makes `n` threads ready before the first command needs them.
pub fn prestart(n: usize) {
    for _ in 0..n {
        run(|| {});
    }
}
