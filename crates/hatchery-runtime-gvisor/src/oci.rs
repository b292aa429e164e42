//! The OCI runtime spec for one sandbox.

use hatchery_runtime::SandboxSpec;
use serde_json::{json, Value};
use std::path::Path;

/// Agent path inside the guest; the host binary is bind-mounted read-only,
/// so templates never need re-baking when the agent changes.
pub const GUEST_AGENT: &str = "/opt/hatchery/agent";

/// Capabilities of the agent (PID 1). Commands get these less
/// CAP_SYS_ADMIN, which only the agent holds (inside gVisor, not on the
/// host) to start the cgroup keeper; the agent drops it from the bounding
/// set of every thread that spawns a command (hatchery-agent `spawner.rs`).
/// No CAP_SYS_PTRACE or CAP_SYS_RESOURCE: without them root inside cannot
/// lift RLIMIT_NPROC or tamper with the agent or the keeper.
const CAPS: &[&str] = &[
    "CAP_SYS_ADMIN",
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_MKNOD",
    "CAP_AUDIT_WRITE",
    "CAP_SETFCAP",
];

/// Host backstop on tasks. gVisor's systrap stubs count here too, and the
/// Sentry dies if it cannot make threads, so the real ceiling is the
/// in-guest RLIMIT_NPROC; this only stops a runaway Sentry.
const HOST_PIDS_BACKSTOP: u64 = 4096;

/// Host memory a forked guest process costs under systrap (measured: a
/// Python fork bomb grows the sandbox cgroup by ~3.5 MiB per process; 8
/// leaves room for the processes to also use some memory).
const MIB_PER_PROCESS: u64 = 8;

/// The in-guest process ceiling actually applied. Each guest process costs
/// host memory beside its own pages, so processes are capped low enough
/// that a fork bomb cannot fill memory before it hits the cap.
/// `cpu.shares` of a sandbox in use: the kernel's default weight.
pub const FOREGROUND_SHARES: u64 = 1024;
/// `cpu.shares` of a pool refill until it is claimed: the least cgroup v1
/// allows, so under contention its restore and warm-up get about 1/512 of
/// what a sandbox in use gets, and all of an otherwise idle CPU.
pub const BACKGROUND_SHARES: u64 = 2;

pub fn effective_nproc(l: &hatchery_runtime::Limits) -> u64 {
    (l.pids_max as u64).min((l.memory_mb / MIB_PER_PROCESS).max(16))
}

/// `tmp_lower` is the empty, read-only directory under the guest's `/tmp`
/// (the shim mounts it); its writable layer is in the sandbox's disk.
pub fn config(spec: &SandboxSpec, agent: &Path, tmp_lower: &Path) -> Value {
    let l = &spec.limits;
    let nproc = effective_nproc(l);
    let period: u64 = 100_000;
    let quota = (l.cpus * period as f64).round().max(1000.0) as u64;
    let shares = if spec.background {
        BACKGROUND_SHARES
    } else {
        FOREGROUND_SHARES
    };
    let network = match &spec.netns {
        Some(path) => json!({"type": "network", "path": path}),
        None => json!({"type": "network"}),
    };
    let fsize = (l.disk_mb + 1) * 1024 * 1024;
    json!({
        "ociVersion": "1.0.0",
        "process": {
            "terminal": false,
            "user": {"uid": 0, "gid": 0},
            "args": [GUEST_AGENT],
            "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"],
            "cwd": "/",
            "capabilities": {"bounding": CAPS, "effective": CAPS, "permitted": CAPS},
            "rlimits": [
                {"type": "RLIMIT_NPROC", "hard": nproc, "soft": nproc},
                {"type": "RLIMIT_NOFILE", "hard": 4096, "soft": 4096},
                // Per file, one MiB over the disk cap so that filling the
                // disk ends in ENOSPC, not in SIGXFSZ.
                {"type": "RLIMIT_FSIZE", "hard": fsize, "soft": fsize}
            ],
            "noNewPrivileges": true
        },
        // Not read-only to gVisor: writes land in the overlay's upper layer
        // in the sandbox's disk (layout.rs `start_flags`), never in the
        // shared host rootfs.
        "root": {"path": spec.rootfs, "readonly": false},
        "hostname": "sandbox",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
            // /tmp: a writable bind of an empty read-only directory, so it
            // is overlaid like the root and its files count against the
            // same disk cap (runsc would otherwise mount an uncapped tmpfs
            // of its own). See docs/threat-model.md, "Disk".
            {"destination": "/tmp", "type": "bind", "source": tmp_lower,
             "options": ["rbind", "rw", "nosuid", "nodev"]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["ro", "nosuid", "noexec", "nodev"]},
            {"destination": GUEST_AGENT, "type": "bind", "source": agent, "options": ["ro", "rbind"]}
        ],
        "linux": {
            "namespaces": [
                {"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}, network
            ],
            "resources": {
                // The guest's own ceiling is the `guest` child cgroup the
                // shim makes (memcg.rs); this one adds the disk and the
                // Sentry's room, and is the host's backstop.
                "memory": {"limit": crate::memcg::sandbox_limit_bytes(l.memory_mb, l.disk_mb)},
                "pids": {"limit": HOST_PIDS_BACKSTOP},
                "cpu": {"quota": quota, "period": period, "shares": shares}
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use hatchery_runtime::Limits;

    #[test]
    fn limits_land_in_the_spec() {
        let spec = SandboxSpec {
            id: "sbx_x".into(),
            rootfs: "/r".into(),
            limits: Limits {
                cpus: 0.5,
                memory_mb: 1024,
                pids_max: 64,
                disk_mb: 10,
            },
            expires_at_ms: 0,
            netns: Some("/run/netns/hy-1".into()),
            background: false,
        };
        let v = config(&spec, Path::new("/a"), Path::new("/b/tmp-lower"));
        assert_eq!(
            v["linux"]["resources"]["memory"]["limit"],
            (1024 + 10 + crate::memcg::RUNTIME_HEADROOM_MB) * 1024 * 1024
        );
        assert_eq!(v["linux"]["resources"]["cpu"]["quota"], 50_000);
        assert_eq!(v["linux"]["resources"]["cpu"]["shares"], FOREGROUND_SHARES);
        let bg = config(
            &SandboxSpec {
                background: true,
                ..spec.clone()
            },
            Path::new("/a"),
            Path::new("/t"),
        );
        assert_eq!(bg["linux"]["resources"]["cpu"]["shares"], BACKGROUND_SHARES);
        assert_eq!(v["process"]["rlimits"][0]["hard"], 64);
        let big = Limits {
            cpus: 1.0,
            memory_mb: 512,
            pids_max: 256,
            disk_mb: 10,
        };
        assert_eq!(effective_nproc(&big), 64, "memory, not pids_max, bounds it");
        assert_eq!(v["root"]["path"], "/r");
        let tmp = v["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["destination"] == "/tmp")
            .unwrap();
        assert_eq!(tmp["source"], "/b/tmp-lower");
        assert!(tmp["options"].as_array().unwrap().contains(&"rw".into()));
        assert_eq!(v["linux"]["namespaces"][4]["path"], "/run/netns/hy-1");
        let caps = v["process"]["capabilities"]["bounding"].as_array().unwrap();
        assert!(!caps
            .iter()
            .any(|c| c == "CAP_SYS_PTRACE" || c == "CAP_SYS_RESOURCE"));
    }
}
