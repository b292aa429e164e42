/// Every bound the daemon enforces, in one place so that docs and tests can
/// name them. The defaults are what docs/api.md lists; `hatcheryd` exposes
/// the ones operators need to change as flags (see docs/operations.md).
#[derive(Debug, Clone)]
pub struct Caps {
    pub default_ttl_s: u64,
    pub max_ttl_s: u64,
    pub default_exec_timeout_s: u64,
    pub max_exec_timeout_s: u64,
    /// Per stream (stdout, stderr) of one exec.
    pub default_output_bytes: u64,
    pub max_output_bytes: u64,
    pub max_file_bytes: u64,
    pub max_stdin_bytes: u64,
    pub max_live_sandboxes: usize,
    pub max_metadata_entries: usize,
    pub max_metadata_key: usize,
    pub max_metadata_value: usize,
    pub max_env_entries: usize,
    pub max_env_bytes: usize,
    pub max_argv: usize,
    pub max_cmd_bytes: usize,
    pub max_path_bytes: usize,
    pub max_list_entries: u32,
    pub default_retention_s: u64,
    pub max_retention_s: u64,
    /// Bytes all snapshots of the store new ones go to may take (a local
    /// store: this host's; a shared one: every host's); 0: no cap.
    pub max_snapshot_store_bytes: u64,
    pub max_fork_count: usize,
    /// Rules per list and ports per rule of a network policy.
    pub net_limits: hatchery_net::PolicyLimits,
    /// Relayed connections into one sandbox open at once (ports API and
    /// previews); more get 429.
    pub max_relays_per_sandbox: usize,
    /// Longest a preview URL may be valid, and the default.
    pub max_preview_ttl_s: u64,
    pub default_preview_ttl_s: u64,
    /// A terminal with no input (keystrokes or resizes) for this long is
    /// closed and everything started in it killed.
    pub terminal_idle_timeout_s: u64,
    /// Terminals attached to one sandbox at once; more get 429.
    pub max_terminals_per_sandbox: usize,
    /// Largest window, in columns and in rows.
    pub max_terminal_cells: u16,
    /// A claimed sandbox unused this long is parked (idle.rs); 0: never.
    pub idle_park_ms: u64,
}

/// `v` if it is in 1..=max: the core's own check of every bound, whatever
/// the caller already validated.
pub fn within(name: &str, v: u64, max: u64) -> Result<u64, crate::CoreError> {
    if v == 0 || v > max {
        return Err(crate::CoreError::Invalid(format!(
            "{name} must be between 1 and {max}"
        )));
    }
    Ok(v)
}

impl Caps {
    /// Keeps every default within its (possibly lowered) maximum, so a
    /// small `--max-ttl` does not turn every create without a TTL into 400.
    pub fn normalized(mut self) -> Self {
        self.default_ttl_s = self.default_ttl_s.min(self.max_ttl_s);
        self.default_exec_timeout_s = self.default_exec_timeout_s.min(self.max_exec_timeout_s);
        self.default_output_bytes = self.default_output_bytes.min(self.max_output_bytes);
        self
    }
}

impl Default for Caps {
    fn default() -> Self {
        Caps {
            default_ttl_s: 300,
            max_ttl_s: 24 * 3600,
            default_exec_timeout_s: 60,
            max_exec_timeout_s: 3600,
            default_output_bytes: 1 << 20,
            max_output_bytes: 16 << 20,
            max_file_bytes: 64 << 20,
            max_stdin_bytes: 1 << 20,
            max_live_sandboxes: 64,
            max_metadata_entries: 32,
            max_metadata_key: 64,
            max_metadata_value: 512,
            max_env_entries: 64,
            max_env_bytes: 32 * 1024,
            max_argv: 1024,
            max_cmd_bytes: 64 * 1024,
            max_path_bytes: 4096,
            max_list_entries: 10_000,
            default_retention_s: 7 * 24 * 3600,
            max_retention_s: 90 * 24 * 3600,
            max_snapshot_store_bytes: 20 << 30,
            max_fork_count: 16,
            net_limits: Default::default(),
            max_relays_per_sandbox: 64,
            max_preview_ttl_s: 24 * 3600,
            default_preview_ttl_s: 3600,
            terminal_idle_timeout_s: 15 * 60,
            idle_park_ms: 3000,
            max_terminals_per_sandbox: 8,
            max_terminal_cells: 1000,
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn defaults_follow_lowered_maxima() {
        let c = super::Caps {
            max_ttl_s: 60,
            max_output_bytes: 1000,
            ..Default::default()
        }
        .normalized();
        assert_eq!((c.default_ttl_s, c.default_output_bytes), (60, 1000));
    }
}
