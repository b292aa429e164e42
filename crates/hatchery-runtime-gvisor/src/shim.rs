//! The per-sandbox shim. Blocking and thread-based: it is tiny, long-lived
//! and must keep working while the daemon is gone.
//!
//! Connections to `shim.sock` start with one role byte:
//! - `A`: the agent channel. Frames are relayed both ways; a new `A`
//!   connection replaces the old one (that is how a restarted daemon
//!   re-attaches).
//! - `C`: one [`ShimControl`] request on channel 0, answered with `Ack`.

use crate::layout::{Layout, ShimConfig};
use crate::memcg;
use crate::teardown;
use hatchery_agent_proto::{read_frame, write_frame, Frame, Kind, ShimControl};
use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub const ROLE_AGENT: u8 = b'A';
pub const ROLE_CONTROL: u8 = b'C';

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0i32; 2];
    // SAFETY: fds is a valid 2-element array for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // Larger than the 64 KiB default, so a whole data frame (relayed bytes,
    // file chunks) fits and crosses with fewer wake-ups; best effort.
    // SAFETY: fcntl on a descriptor pipe2 just gave us.
    unsafe { libc::fcntl(fds[1], libc::F_SETPIPE_SZ, PIPE_BYTES) };
    // SAFETY: pipe2 succeeded, so both fds are open and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// How often the shim looks for a guest process outside the guest's
/// memory cgroup.
const SWEEP_MS: u64 = 250;
/// A guest OOM kill this recent when the guest ends makes it a memory
/// death (`guest_oom`).
const RECENT_OOM_MS: u64 = 10_000;

/// Buffer of each agent pipe.
const PIPE_BYTES: libc::c_int = 1 << 20;

struct Shim {
    cfg: ShimConfig,
    bundle: PathBuf,
    expires_at: AtomicU64,
    to_agent: Mutex<File>,
    client: Mutex<Option<UnixStream>>,
    /// Set once the shim itself ends the sandbox (TTL, shutdown): the
    /// agent's channel then closes because of us, not of the guest.
    destroying: AtomicBool,
    /// Unix ms of the guest OOM killer's last kill (oom.rs); 0: none.
    last_oom_kill_ms: Arc<AtomicU64>,
}

impl Shim {
    /// The guest ended on its own: if memory killed it, say so where the
    /// daemon looks (Layout::end_file) before teardown erases the cgroups
    /// that tell. Best effort: without it the daemon says `guest_exited`.
    fn note_end_cause(&self) {
        if self.destroying.load(Ordering::SeqCst) {
            return;
        }
        let last = self.last_oom_kill_ms.load(Ordering::SeqCst);
        let recent = last > 0 && now_ms().saturating_sub(last) <= RECENT_OOM_MS;
        let guest_oom_now = recent || memcg::guest_under_oom(&self.cfg.id);
        let Some(cause) = memcg::end_cause(&self.cfg.id, guest_oom_now) else {
            return;
        };
        let path = Layout::end_file_beside(&self.bundle);
        let written = path
            .parent()
            .map(std::fs::create_dir_all)
            .unwrap_or(Ok(()))
            .and_then(|()| std::fs::write(&path, serde_json::to_vec(&cause).unwrap_or_default()));
        if let Err(e) = written {
            eprintln!(
                "hatchery-shim {}: could not note {cause:?}: {e}",
                self.cfg.id
            );
        }
    }

    fn destroy_and_exit(&self, why: &str) -> ! {
        self.destroying.store(true, Ordering::SeqCst);
        eprintln!("hatchery-shim {}: destroying sandbox: {why}", self.cfg.id);
        teardown::destroy(
            &self.cfg.runsc,
            &self.cfg.runsc_flags,
            &self.cfg.id,
            &self.bundle,
        );
        std::process::exit(0);
    }
}

/// Runs the shim for the bundle at `bundle`. Prints `ready` (or `error: …`)
/// on stdout once the sandbox is up, then detaches its stdio to `shim.log`.
pub fn run(bundle: &Path) -> ! {
    // Our own session: we must outlive the daemon that started us.
    // SAFETY: setsid has no memory effects; failure (already a leader) is
    // harmless.
    unsafe { libc::setsid() };
    // The sandbox's Sentry and gofer, orphaned when `runsc run -detach`
    // exits, become our children instead of PID 1's, so teardown can reap
    // them at once (see teardown::destroy) whatever init the host runs.
    // SAFETY: prctl with integer arguments only; failure leaves PID 1 as
    // their reaper, which is only slower.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let cfg: ShimConfig = match std::fs::read(ShimConfig::path(bundle))
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
    {
        Ok(c) => c,
        Err(e) => {
            println!("error: shim.json: {e}");
            std::process::exit(1);
        }
    };
    match start(&cfg, bundle) {
        Ok((to_agent, from_agent, listener, split, killer, steps)) => serve(
            cfg, bundle, to_agent, from_agent, listener, split, killer, &steps,
        ),
        Err(e) => {
            println!("error: {e}");
            let _ = std::io::stdout().flush();
            teardown::destroy(&cfg.runsc, &cfg.runsc_flags, &cfg.id, bundle);
            std::process::exit(1);
        }
    }
}

type Started = (
    File,
    File,
    UnixListener,
    Option<memcg::Split>,
    Option<crate::oom::Killer>,
    String,
);

fn start(cfg: &ShimConfig, bundle: &Path) -> std::io::Result<Started> {
    // Where a start's time went, for shim.log (docs/benchmarks.md breaks
    // forks down with it).
    let mut steps = String::new();
    let mut last = std::time::Instant::now();
    let mut mark = |name: &str| {
        let now = std::time::Instant::now();
        steps += &format!(" {name}={:.1}", (now - last).as_secs_f64() * 1000.0);
        last = now;
    };
    private_mounts(cfg, bundle)?;
    mark("mounts");
    let (agent_stdin, to_agent) = pipe()?;
    let (from_agent, agent_stdout) = pipe()?;
    let log = File::create(bundle.join("runsc.log"))?;
    let mut cmd = Command::new(&cfg.runsc);
    cmd.args(&cfg.runsc_flags);
    match &cfg.restore_from {
        // The restored agent keeps running on the fresh pipes given here;
        // the pipes of the sandbox that was checkpointed are not involved.
        Some(image) => cmd
            .arg("restore")
            .arg(format!("--image-path={}", image.display())),
        None => cmd.arg("run"),
    };
    mark("pipes");
    let status = cmd
        .arg(format!("--bundle={}", bundle.display()))
        .arg("--detach")
        .arg(&cfg.id)
        .stdin(Stdio::from(agent_stdin))
        .stdout(Stdio::from(agent_stdout))
        .stderr(Stdio::from(log))
        .status()?;
    mark("runsc");
    if !status.success() {
        let log = std::fs::read_to_string(bundle.join("runsc.log")).unwrap_or_default();
        let tail: String = log.lines().rev().take(5).collect::<Vec<_>>().join(" | ");
        return Err(std::io::Error::other(format!(
            "runsc run failed ({status}): {tail}"
        )));
    }
    // Before anyone can run code in it (the daemon waits for `ready`).
    let split = if cfg.memory_mb > 0 {
        memcg::Split::create(&cfg.id, cfg.memory_mb).map_err(std::io::Error::other)?
    } else {
        None
    };
    mark("memcg");
    // The guest's OOM killer (oom.rs), armed before `ready` too. Without
    // it the kernel's stays in charge.
    let killer = split.as_ref().and_then(|_| {
        crate::oom::Killer::arm(
            &memcg::sandbox_dir(&cfg.id),
            bundle,
            memcg::guest_limit_bytes(cfg.memory_mb),
        )
        .inspect_err(|e| eprintln!("hatchery-shim: the kernel's OOM killer stays in charge: {e}"))
        .ok()
    });
    let sock = bundle.join("shim.sock");
    let _ = std::fs::remove_file(&sock);
    let listener = UnixListener::bind(&sock)?;
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o600))?;
    mark("oom_socket");
    Ok((
        File::from(to_agent),
        File::from(from_agent),
        listener,
        split,
        killer,
        steps,
    ))
}

#[allow(clippy::too_many_arguments)]
fn serve(
    cfg: ShimConfig,
    bundle: &Path,
    to_agent: File,
    from_agent: File,
    listener: UnixListener,
    split: Option<memcg::Split>,
    killer: Option<crate::oom::Killer>,
    steps: &str,
) -> ! {
    std::fs::write(bundle.join("shim.pid"), std::process::id().to_string()).ok();
    println!("ready");
    let _ = std::io::stdout().flush();
    detach_stdio(bundle);
    eprintln!("hatchery-shim {}: started (ms):{steps}", cfg.id);

    let last_oom_kill_ms = killer
        .as_ref()
        .map_or_else(Default::default, |k| k.last_kill());
    let shim = Arc::new(Shim {
        expires_at: AtomicU64::new(cfg.expires_at_ms),
        cfg,
        bundle: bundle.to_path_buf(),
        to_agent: Mutex::new(to_agent),
        client: Mutex::new(None),
        destroying: AtomicBool::new(false),
        last_oom_kill_ms,
    });

    let s = Arc::clone(&shim);
    std::thread::spawn(move || loop {
        if now_ms() >= s.expires_at.load(Ordering::SeqCst) {
            s.destroy_and_exit("ttl expired");
        }
        std::thread::sleep(Duration::from_millis(200));
    });

    if let Some(k) = killer {
        std::thread::spawn(move || k.run());
    }
    if let Some(split) = split {
        // Stubs are cloned from stubs already in `guest`; this catches one
        // the Sentry might start itself (memcg.rs).
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(SWEEP_MS));
            match split.sweep() {
                Ok(0) => {}
                Ok(n) => eprintln!("hatchery-shim: moved {n} process(es) into the guest cgroup"),
                // The sandbox is going away.
                Err(_) => return,
            }
        });
    }

    let s = Arc::clone(&shim);
    std::thread::spawn(move || {
        let mut r = BufReader::with_capacity(256 * 1024, from_agent);
        loop {
            match read_frame(&mut r) {
                Ok(Some(f)) => {
                    let mut c = s.client.lock().unwrap_or_else(|p| p.into_inner());
                    // No daemon attached: the frame has nobody to go to.
                    if let Some(conn) = c.as_mut() {
                        if write_frame(conn, &f).is_err() {
                            *c = None;
                        }
                    }
                }
                Ok(None) => {
                    s.note_end_cause();
                    s.destroy_and_exit("agent channel closed")
                }
                Err(e) => {
                    s.note_end_cause();
                    s.destroy_and_exit(&format!("agent channel broken: {e}"))
                }
            }
        }
    });

    for conn in listener.incoming() {
        let Ok(mut conn) = conn else { continue };
        let mut role = [0u8; 1];
        if conn.read_exact(&mut role).is_err() {
            continue;
        }
        match role[0] {
            ROLE_AGENT => attach(&shim, conn),
            ROLE_CONTROL => control(&shim, conn),
            _ => {}
        }
    }
    shim.destroy_and_exit("listener closed");
}

fn attach(shim: &Arc<Shim>, conn: UnixStream) {
    let Ok(reader) = conn.try_clone() else { return };
    {
        let mut c = shim.client.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(old) = c.take() {
            let _ = old.shutdown(std::net::Shutdown::Both);
        }
        *c = Some(conn);
    }
    let s = Arc::clone(shim);
    std::thread::spawn(move || {
        // Whole frames only: a daemon that dies mid-frame must not leave
        // half a frame in the agent's stream.
        let mut r = BufReader::with_capacity(256 * 1024, reader);
        while let Ok(Some(f)) = read_frame(&mut r) {
            let mut w = s.to_agent.lock().unwrap_or_else(|p| p.into_inner());
            if write_frame(&mut *w, &f).is_err() {
                break;
            }
        }
    });
}

fn control(shim: &Shim, mut conn: UnixStream) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let Ok(Some(frame)) = read_frame(&mut conn) else {
        return;
    };
    let Ok(msg) = frame.parse::<ShimControl>() else {
        return;
    };
    match msg {
        ShimControl::SetExpiry { unix_ms } => {
            shim.expires_at.store(unix_ms, Ordering::SeqCst);
            let _ = write_frame(&mut conn, &Frame::json(0, Kind::Control, &ShimControl::Ack));
        }
        ShimControl::Shutdown => {
            // Ack only after teardown, so the caller knows it is complete.
            teardown::destroy(
                &shim.cfg.runsc,
                &shim.cfg.runsc_flags,
                &shim.cfg.id,
                &shim.bundle,
            );
            let _ = write_frame(&mut conn, &Frame::json(0, Kind::Control, &ShimControl::Ack));
            std::process::exit(0);
        }
        ShimControl::Ack => {}
    }
}

/// Points stdin at /dev/null and stdout/stderr at `shim.log`, so the daemon
/// reading our "ready" line sees EOF and we never hold its pipes.
fn detach_stdio(bundle: &Path) {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(bundle.join("shim.log"));
    let null = File::open("/dev/null");
    if let (Ok(log), Ok(null)) = (log, null) {
        use std::os::fd::AsRawFd;
        // SAFETY: dup2 onto the standard fds with descriptors we own; the
        // originals are closed by dup2 atomically.
        unsafe {
            libc::dup2(null.as_raw_fd(), 0);
            libc::dup2(log.as_raw_fd(), 1);
            libc::dup2(log.as_raw_fd(), 2);
        }
    }
}

/// Moves the shim (and so runsc and the sandbox it starts) into a private
/// mount namespace and mounts there what the sandbox needs from the host:
/// - with `mask_proc_sys_net`, an empty tmpfs over `/proc/sys/net` (see
///   [`ShimConfig::mask_proc_sys_net`]; only that is hidden, runsc reads
///   other `/proc/sys` entries at start);
/// - the sandbox's disk, a tmpfs of `disk_mb` ([`Layout::disk_dir`]), and
///   the empty read-only lower layer of its `/tmp` ([`Layout::tmp_lower`]).
///
/// The namespace dies with the last process in it, so none of these can be
/// left behind on the host, whatever kills the sandbox: the daemon's mount
/// table never holds them.
fn private_mounts(cfg: &ShimConfig, bundle: &Path) -> std::io::Result<()> {
    fn check(what: &str, rc: i32) -> std::io::Result<()> {
        if rc == 0 {
            Ok(())
        } else {
            let e = std::io::Error::last_os_error();
            Err(std::io::Error::new(e.kind(), format!("{what}: {e}")))
        }
    }
    fn cstr(p: &Path) -> std::io::Result<std::ffi::CString> {
        std::ffi::CString::new(p.as_os_str().as_encoded_bytes())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
    }
    let tmpfs = c"tmpfs";
    let nosuid = libc::MS_NOSUID | libc::MS_NODEV;
    // SAFETY: unshare affects only this (single-threaded) process; the
    // mount calls take valid NUL-terminated strings that outlive the calls.
    unsafe {
        check("unshare mount namespace", libc::unshare(libc::CLONE_NEWNS))?;
        check(
            "make / private",
            libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ),
        )?;
    }
    if cfg.mask_proc_sys_net {
        // SAFETY: as above.
        check("mask /proc/sys/net", unsafe {
            libc::mount(
                tmpfs.as_ptr(),
                c"/proc/sys/net".as_ptr(),
                tmpfs.as_ptr(),
                nosuid | libc::MS_NOEXEC,
                c"size=4k,mode=0555".as_ptr().cast(),
            )
        })?;
    }
    if cfg.disk_mb > 0 {
        let (disk, lower) = (Layout::disk_dir(bundle), Layout::tmp_lower(bundle));
        std::fs::create_dir_all(&disk)?;
        std::fs::create_dir_all(&lower)?;
        let (disk_c, lower_c) = (cstr(&disk)?, cstr(&lower)?);
        let disk_opts = std::ffi::CString::new(format!("size={}m,mode=0700", cfg.disk_mb))
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let lower_opts = c"size=4k,mode=1777";
        // SAFETY: as above.
        unsafe {
            // Not noexec: the Sentry maps the upper layer's file with
            // PROT_EXEC when the guest runs a binary it wrote.
            check(
                "mount the sandbox disk",
                libc::mount(
                    tmpfs.as_ptr(),
                    disk_c.as_ptr(),
                    tmpfs.as_ptr(),
                    nosuid,
                    disk_opts.as_ptr().cast(),
                ),
            )?;
            // Read-only: were /tmp ever not overlaid, a guest write would
            // fail here rather than land on the host.
            check(
                "mount the /tmp lower layer",
                libc::mount(
                    tmpfs.as_ptr(),
                    lower_c.as_ptr(),
                    tmpfs.as_ptr(),
                    nosuid | libc::MS_NOEXEC,
                    lower_opts.as_ptr().cast(),
                ),
            )?;
            check(
                "make the /tmp lower layer read-only",
                libc::mount(
                    std::ptr::null(),
                    lower_c.as_ptr(),
                    std::ptr::null(),
                    libc::MS_REMOUNT | libc::MS_RDONLY | nosuid | libc::MS_NOEXEC,
                    lower_opts.as_ptr().cast(),
                ),
            )?;
        }
    }
    Ok(())
}
