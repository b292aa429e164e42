//! Starting a command inside its unit.
//!
//! A child is born in the cgroup of the thread that spawns it, so the
//! spawning thread joins the unit first. Such a thread must never go back
//! to the root cgroup (that would mean opening the root's `tasks` file,
//! which guest code could then race for), so it spawns once and exits.
//! Threads cost over a millisecond to create under gVisor, so a few fresh
//! ones are kept ready by a refiller thread that lives in the root cgroup.
//!
//! The spawning thread also drops CAP_SYS_ADMIN from its bounding set: the
//! agent needs it (to start the cgroup keeper), commands must never have it.

use std::sync::mpsc::{sync_channel, Receiver, Sender, SyncSender};
use std::sync::{Mutex, OnceLock};

type Job = Box<dyn FnOnce() + Send>;

const READY: usize = 2;
/// From linux/capability.h.
const CAP_SYS_ADMIN: u32 = 21;

fn ready() -> &'static Mutex<Receiver<Sender<Job>>> {
    static R: OnceLock<Mutex<Receiver<Sender<Job>>>> = OnceLock::new();
    R.get_or_init(|| {
        let (tx, rx) = sync_channel(READY);
        std::thread::spawn(move || refill(tx));
        Mutex::new(rx)
    })
}

fn refill(tx: SyncSender<Sender<Job>>) {
    loop {
        let (job_tx, job_rx) = std::sync::mpsc::channel::<Job>();
        let made = std::thread::Builder::new()
            .name("spawn-once".into())
            .spawn(move || {
                if let Ok(job) = job_rx.recv() {
                    job();
                }
            });
        if made.is_err() {
            std::thread::sleep(std::time::Duration::from_millis(50));
            continue;
        }
        // Blocks while READY threads are waiting, so refilling costs
        // nothing until they are used.
        if tx.send(job_tx).is_err() {
            return;
        }
    }
}

/// Makes the ready threads before the first command needs them.
pub fn prestart() {
    let _ = ready();
}

/// Runs `f` on a fresh thread that is used for nothing else and exits after,
/// and waits for its result.
pub fn once<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    let job: Job = Box::new(move || {
        let _ = tx.send(f());
    });
    let worker = ready()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .recv()
        .ok()?;
    worker.send(job).ok()?;
    rx.recv().ok()
}

/// Removes CAP_SYS_ADMIN from the calling thread's bounding set (what a
/// child's capabilities are computed from at execve) and from its
/// effective and permitted sets.
pub fn drop_sys_admin() {
    // SAFETY: prctl and capget/capset with pointers to locals of the layout
    // the kernel expects (_LINUX_CAPABILITY_VERSION_3, two data words).
    unsafe {
        libc::prctl(
            libc::PR_CAPBSET_DROP,
            CAP_SYS_ADMIN as libc::c_ulong,
            0,
            0,
            0,
        );
        let mut hdr = CapHeader {
            version: 0x2008_0522,
            pid: 0,
        };
        let mut data = [CapData::default(); 2];
        if libc::syscall(libc::SYS_capget, &mut hdr, data.as_mut_ptr()) == 0 {
            let bit = 1u32 << CAP_SYS_ADMIN;
            data[0].effective &= !bit;
            data[0].permitted &= !bit;
            data[0].inheritable &= !bit;
            libc::syscall(libc::SYS_capset, &mut hdr, data.as_ptr());
        }
    }
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}
