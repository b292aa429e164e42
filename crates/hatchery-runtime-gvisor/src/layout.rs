use std::path::{Path, PathBuf};

/// Where things are and how runsc is invoked. One per daemon; two daemons
/// with different state directories never see each other's sandboxes
/// because each has its own runsc root.
#[derive(Debug, Clone)]
pub struct GvisorConfig {
    pub state_dir: PathBuf,
    pub runsc: PathBuf,
    pub shim: PathBuf,
    pub agent: PathBuf,
    /// "systrap" here; "kvm" on hosts with real KVM.
    pub platform: String,
    /// Sandboxes get gVisor's own network stack (netstack) on the
    /// interfaces of their slot's namespace; otherwise no network at all.
    pub network: bool,
}

#[derive(Debug, Clone)]
pub struct Layout {
    pub cfg: GvisorConfig,
}

impl Layout {
    pub fn runsc_root(&self) -> PathBuf {
        self.cfg.state_dir.join("runsc")
    }
    pub fn sandboxes(&self) -> PathBuf {
        self.cfg.state_dir.join("sandboxes")
    }
    pub fn bundle(&self, id: &str) -> PathBuf {
        self.sandboxes().join(id)
    }
    pub fn socket(&self, id: &str) -> PathBuf {
        self.bundle(id).join("shim.sock")
    }
    /// Global runsc flags, identical for run, kill and delete.
    pub fn runsc_flags(&self) -> Vec<String> {
        vec![
            format!("--root={}", self.runsc_root().display()),
            format!("--platform={}", self.cfg.platform),
            // netstack, not hostinet: the guest's TCP/IP runs inside the
            // Sentry, and it can be checkpointed (hostinet cannot).
            if self.cfg.network {
                "--network=sandbox".into()
            } else {
                "--network=none".into()
            },
            // Writable root in sandbox memory over the shared read-only
            // template rootfs: the host copy is never written, and what the
            // guest writes is charged to its own memory cgroup.
            "--overlay2=root:memory".into(),
        ]
    }
}

/// What the shim needs to know, written as `shim.json` in the bundle.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ShimConfig {
    pub id: String,
    pub runsc: PathBuf,
    pub runsc_flags: Vec<String>,
    pub expires_at_ms: u64,
    /// Start by `runsc restore` from this checkpoint image instead of
    /// booting: how templates, pools and forks come up.
    #[serde(default)]
    pub restore_from: Option<PathBuf>,
    /// Run runsc in a private mount namespace with `/proc/sys/net` masked.
    /// runsc 20240729 decides it is in the host's root network namespace
    /// when `/proc/sys/net/core/rmem_default` exists, and refuses netstack;
    /// on current kernels that file exists in every namespace.
    #[serde(default)]
    pub mask_proc_sys_net: bool,
}

impl ShimConfig {
    pub fn path(bundle: &Path) -> PathBuf {
        bundle.join("shim.json")
    }
}
