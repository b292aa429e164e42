//! The cgroup keeper: a small process (`hatchery-agent --cgroup-keeper`)
//! that alone can see gVisor's in-sandbox cgroup hierarchies.
//!
//! Why a separate process in its own mount namespace: guest code runs as
//! root with CAP_DAC_OVERRIDE, so any cgroupfs it can reach it can write,
//! and `echo $$ > …/cgroup.procs` would take it out of its exec's unit.
//! gVisor lets root open another process's descriptors through
//! `/proc/<pid>/fd` (measured), so even a directory fd held by the agent
//! would be a way in. The keeper therefore mounts the hierarchies in a
//! private mount namespace (guest root cannot follow `/proc/<pid>/root`
//! into it, cannot `setns` without CAP_SYS_ADMIN, and cannot ptrace a
//! non-dumpable process: all measured) and opens files only for the
//! microseconds of one operation, and only files of exec units, never of
//! the root cgroup.
//!
//! Protocol on stdin/stdout, one line each way:
//! `new N`, `join N TID`, `stat N` → `ok CPU_NS MEM_BYTES NPROCS`,
//! `kill N` → `ok LEFT`, `rm N`; anything else or a failure → `err …`.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where the hierarchies are mounted, inside the keeper's namespace only.
const BASE: &str = "/mnt";
const CONTROLLERS: [&str; 3] = ["cpuacct", "pids", "memory"];
const KILL_BUDGET: Duration = Duration::from_secs(2);

pub fn main() -> ! {
    if let Err(e) = setup() {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "err setup: {e}");
        let _ = out.flush();
        std::process::exit(1);
    }
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "ready");
    let _ = out.flush();
    let agent = std::os::unix::process::parent_id() as i32;
    let me = std::process::id() as i32;
    let spare = [1, agent, me];
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let reply = handle(&line, &spare).unwrap_or_else(|e| format!("err {e}"));
        if writeln!(out, "{reply}").and_then(|_| out.flush()).is_err() {
            break;
        }
    }
    std::process::exit(0)
}

fn setup() -> std::io::Result<()> {
    // SAFETY: plain syscalls on constant, NUL-terminated arguments; this
    // process is single-threaded here, as unshare(CLONE_NEWNS) requires.
    unsafe {
        check(libc::unshare(libc::CLONE_NEWNS))?;
        check(libc::mount(
            c"none".as_ptr(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ))?;
        check(libc::mount(
            c"tmpfs".as_ptr(),
            c"/mnt".as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            c"size=64k,mode=0700".as_ptr().cast(),
        ))?;
    }
    for c in CONTROLLERS {
        let dir = Path::new(BASE).join(c);
        std::fs::create_dir(&dir)?;
        let target = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())?;
        let opts = std::ffi::CString::new(c)?;
        // SAFETY: valid C strings that outlive the call.
        check(unsafe {
            libc::mount(
                c"cgroup".as_ptr(),
                target.as_ptr(),
                c"cgroup".as_ptr(),
                0,
                opts.as_ptr().cast(),
            )
        })?;
    }
    // Not dumpable: guest root may then neither ptrace us nor follow our
    // /proc links into this namespace.
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    Ok(())
}

fn check(rc: i32) -> std::io::Result<()> {
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Unit names come from the agent, which makes them `[a-z0-9]+`; anything
/// else is refused so that no request can name a path outside a unit.
fn unit(name: &str) -> Result<&str, String> {
    let ok = !name.is_empty()
        && name.len() <= 32
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    ok.then_some(name)
        .ok_or_else(|| "bad unit name".to_string())
}

fn path(controller: &str, name: &str, file: &str) -> PathBuf {
    Path::new(BASE).join(controller).join(name).join(file)
}

fn handle(line: &str, spare: &[i32]) -> Result<String, String> {
    let mut words = line.split_ascii_whitespace();
    let (verb, name) = (
        words.next().unwrap_or(""),
        unit(words.next().unwrap_or(""))?,
    );
    let err = |what: &str, e: std::io::Error| format!("{what} {name}: {e}");
    match verb {
        "new" => {
            for c in CONTROLLERS {
                std::fs::create_dir(Path::new(BASE).join(c).join(name))
                    .map_err(|e| err("new", e))?;
            }
            Ok("ok".into())
        }
        "join" => {
            let tid: i32 = words.next().and_then(|t| t.parse().ok()).ok_or("bad tid")?;
            for c in CONTROLLERS {
                std::fs::write(path(c, name, "tasks"), tid.to_string())
                    .map_err(|e| err("join", e))?;
            }
            Ok("ok".into())
        }
        "stat" => {
            let cpu =
                read_u64(&path("cpuacct", name, "cpuacct.usage")).map_err(|e| err("stat", e))?;
            let mem = read_u64(&path("memory", name, "memory.usage_in_bytes")).unwrap_or(0);
            let procs = procs(name, spare).map_err(|e| err("stat", e))?.len();
            Ok(format!("ok {cpu} {mem} {procs}"))
        }
        "kill" => {
            // No new processes in the unit while we sweep it.
            let _ = std::fs::write(path("pids", name, "pids.max"), "0");
            let end = Instant::now() + KILL_BUDGET;
            loop {
                let left = procs(name, spare).map_err(|e| err("kill", e))?;
                if left.is_empty() || Instant::now() >= end {
                    return Ok(format!("ok {}", left.len()));
                }
                for pid in left {
                    // SAFETY: signal delivery to a pid read from the unit.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        "rm" => {
            for c in CONTROLLERS {
                match std::fs::remove_dir(Path::new(BASE).join(c).join(name)) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(err("rm", e)),
                }
            }
            Ok("ok".into())
        }
        _ => Err(format!("unknown request {verb:?}")),
    }
}

fn read_u64(p: &Path) -> std::io::Result<u64> {
    let s = std::fs::read_to_string(p)?;
    s.trim()
        .parse()
        .map_err(|_| std::io::Error::other(format!("unparsable {}", p.display())))
}

/// Processes in the unit, less the agent and the keeper (a spawning agent
/// thread sits in the unit for a moment, and its process id is the agent's).
fn procs(name: &str, spare: &[i32]) -> std::io::Result<Vec<i32>> {
    let s = std::fs::read_to_string(path("cpuacct", name, "cgroup.procs"))?;
    Ok(s.split_ascii_whitespace()
        .filter_map(|p| p.parse().ok())
        .filter(|p| !spare.contains(p))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_names_cannot_leave_the_hierarchy() {
        assert!(unit("e12").is_ok());
        for bad in ["", "..", "../x", "a/b", "E1", "a b", &"x".repeat(33)] {
            assert!(unit(bad).is_err(), "{bad:?}");
        }
        assert!(handle("new ../../etc", &[]).is_err());
        assert!(handle("frob e1", &[]).unwrap_err().contains("unknown"));
    }

    #[test]
    fn paths_stay_under_base() {
        assert_eq!(
            path("pids", "e3", "pids.max"),
            PathBuf::from("/mnt/pids/e3/pids.max")
        );
    }
}
