//! Killing a command's whole tree. A process group is not enough: `setsid`,
//! `nohup` and double forks leave it. Every command we start carries a marker
//! in its environment, which its descendants inherit; we kill its session's
//! process group and then sweep /proc for the marker until nothing is left.

use std::time::Duration;

pub fn kill_tree(pgid: i32, marker: &[u8]) {
    for _ in 0..100 {
        // SAFETY: kill(2) with a negative pid signals a process group; the
        // worst case on a stale pgid is ESRCH.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
        let pids = marked_pids(marker);
        if pids.is_empty() {
            return;
        }
        for pid in pids {
            // SAFETY: plain signal delivery to a pid we just read from /proc.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn marked_pids(marker: &[u8]) -> Vec<i32> {
    let me = std::process::id() as i32;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != me && pid != 1)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .map(|env| env.split(|&b| b == 0).any(|kv| kv == marker))
                .unwrap_or(false)
        })
        .collect()
}
