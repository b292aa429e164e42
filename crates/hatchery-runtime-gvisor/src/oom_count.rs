//! The shim's count of its own OOM kills, kept in the sandbox's bundle.
//!
//! Its own module because both sides read it: the killer (oom.rs) counts
//! each kill here before the signal, and the cgroup accounting (memcg.rs)
//! adds it to the kernel's count; neither needs the other for that.

use std::path::{Path, PathBuf};

/// The file (in the bundle) counting the shim's OOM kills.
pub fn kills_file(bundle: &Path) -> PathBuf {
    bundle.join("oom_kills")
}

/// The shim's OOM kills so far in the sandbox whose bundle is `bundle`.
pub fn kills(bundle: &Path) -> u64 {
    std::fs::read_to_string(kills_file(bundle))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}
