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
    /// Where the shim leaves why a guest ended on its own (an
    /// [`hatchery_runtime::EndCause`] as JSON), for the daemon to read
    /// after the agent's channel closed: outside the bundle, which the
    /// shim's teardown removes. `destroy` removes it.
    pub fn end_file(&self, id: &str) -> PathBuf {
        Self::end_file_beside(&self.bundle(id))
    }
    /// [`Layout::end_file`] from the bundle's path (what the shim knows).
    pub fn end_file_beside(bundle: &Path) -> PathBuf {
        let id = bundle.file_name().unwrap_or_default();
        let sandboxes = bundle.parent().unwrap_or(Path::new("/"));
        sandboxes
            .parent()
            .unwrap_or(Path::new("/"))
            .join("ends")
            .join(id)
    }
    pub fn socket(&self, id: &str) -> PathBuf {
        self.bundle(id).join("shim.sock")
    }
    /// Mount point of the sandbox's disk: a tmpfs of `disk_mb` that the
    /// shim mounts in its private mount namespace, holding the upper layer
    /// of every writable filesystem of the guest (root and `/tmp`).
    pub fn disk_dir(bundle: &Path) -> PathBuf {
        bundle.join("disk")
    }
    /// Mount point of the read-only, empty lower layer of the guest's
    /// `/tmp` (also mounted by the shim, in its namespace).
    pub fn tmp_lower(bundle: &Path) -> PathBuf {
        bundle.join("tmp-lower")
    }
    /// Flags for `runsc run` and `runsc restore` of sandbox `id`: the
    /// global ones plus where its writable layers live.
    pub fn start_flags(&self, id: &str) -> Vec<String> {
        let mut f = self.runsc_flags();
        // `all`: the root and every writable bind mount (the guest's /tmp)
        // get an overlay whose upper layer is a file in the sandbox's disk
        // tmpfs, so everything the guest writes shares one cap and a full
        // disk is ENOSPC inside, not the memory cgroup's OOM killer. The
        // host copies (template rootfs, empty /tmp) are never written, and
        // the upper layers are part of every checkpoint.
        f.push(format!(
            "--overlay2=all:dir={}",
            Self::disk_dir(&self.bundle(id)).display()
        ));
        f
    }
    /// Global runsc flags, identical for every command (run and restore
    /// add [`Layout::start_flags`]'s overlay).
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
    /// Size of the sandbox's disk tmpfs ([`Layout::disk_dir`]), the cap on
    /// everything the guest writes.
    #[serde(default)]
    pub disk_mb: u64,
    /// The guest's memory: the limit of the `guest` cgroup the shim makes
    /// (memcg.rs). 0 (a shim.json from before) makes none.
    #[serde(default)]
    pub memory_mb: u64,
}

impl ShimConfig {
    pub fn path(bundle: &Path) -> PathBuf {
        bundle.join("shim.json")
    }
}
