//! Wire types of API v1 and their validation. Unknown fields are rejected so
//! that a typo (`ttl` for `ttl_seconds`) is a 400, not a silent default.

use crate::ApiError;
use hatchery_core::exec::{ExecOutcome, ExecParams};
use hatchery_core::{Caps, SandboxInfo};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;
use utoipa::ToSchema;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSandbox {
    /// Template name; defaults to `code-interpreter`.
    pub template: Option<String>,
    /// Lifetime in seconds, 1..=max (default 300).
    pub ttl_seconds: Option<i64>,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// Environment for every command run in the sandbox.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Egress policy; default `{"egress":"deny"}`: nothing leaves.
    pub network: Option<crate::network::NetworkPolicy>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PatchSandbox {
    /// New lifetime, counted from now.
    pub ttl_seconds: i64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Sandbox {
    /// `sbx_` followed by 16 characters.
    pub id: String,
    pub template: String,
    /// `starting`, `running` or `stopped`; `lost` in a
    /// `?state=lost` listing.
    pub state: String,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub expires_at: String,
    pub metadata: BTreeMap<String, String>,
    /// On create and fork only: `pool` (claimed a warm, never-used
    /// sandbox), `restore` (restored the template checkpoint), `cold`
    /// (booted), or `fork` (restored a snapshot).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boot_mode: Option<String>,
    /// On create and fork only: milliseconds from request to agent ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boot_ms: Option<u64>,
    /// Lost sandboxes only (`?state=lost`): the host it was lost with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Lost sandboxes only: when it was marked lost (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<String>,
    /// Lost sandboxes only: why it ended (`host_lost`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_reason: Option<String>,
}

impl Sandbox {
    /// A sandbox stopped because its host was lost, as a `?state=lost`
    /// listing shows it.
    pub fn lost(i: SandboxInfo, end: hatchery_store::StoppedRow) -> Sandbox {
        Sandbox {
            state: "lost".into(),
            host: Some(end.host_id),
            ended_at: Some(hatchery_core::rfc3339(end.ended_at_ms)),
            end_reason: Some(end.end_reason),
            ..i.into()
        }
    }
}

impl From<SandboxInfo> for Sandbox {
    fn from(i: SandboxInfo) -> Self {
        Sandbox {
            id: i.id,
            template: i.template,
            state: i.state,
            created_at: hatchery_core::rfc3339(i.created_at_ms),
            expires_at: hatchery_core::rfc3339(i.expires_at_ms),
            metadata: i.metadata,
            boot_mode: i.boot_mode.map(str::to_string),
            boot_ms: i.boot_ms,
            host: None,
            ended_at: None,
            end_reason: None,
        }
    }
}

#[derive(Debug, Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct CreateSnapshot {
    /// How long the snapshot is kept, in seconds (default 7 days).
    pub retention_seconds: Option<i64>,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// `true` (the default): memory, processes and files, and a fork
    /// carries on where the sandbox was. `false`: the files the sandbox
    /// created or changed only (a filesystem-only pause), at most its
    /// disk plus 64 MiB; a fork boots from the template with those files,
    /// and no process survives.
    pub memory: Option<bool>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Snapshot {
    /// `snap_` followed by 16 characters.
    pub id: String,
    pub sandbox_id: String,
    pub template: String,
    pub created_at: String,
    pub expires_at: String,
    pub size_bytes: u64,
    pub metadata: BTreeMap<String, String>,
    /// Whether it holds memory and processes (`false`: files only).
    pub memory: bool,
}

impl From<hatchery_core::SnapshotInfo> for Snapshot {
    fn from(i: hatchery_core::SnapshotInfo) -> Self {
        Snapshot {
            id: i.id,
            sandbox_id: i.sandbox_id,
            template: i.template,
            created_at: hatchery_core::rfc3339(i.created_at_ms),
            expires_at: hatchery_core::rfc3339(i.expires_at_ms),
            size_bytes: i.size_bytes,
            metadata: i.metadata,
            memory: i.kind == hatchery_core::store::SnapshotKind::Memory,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SnapshotList {
    pub snapshots: Vec<Snapshot>,
}

#[derive(Debug, Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct ForkBody {
    pub ttl_seconds: Option<i64>,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// Egress policy of every fork; default deny-all (a fork does not
    /// inherit its source's policy).
    pub network: Option<crate::network::NetworkPolicy>,
    /// How many forks (default 1).
    pub count: Option<i64>,
}

/// `PUT /v1/snapshots/{id}/pool`: how many forks of the snapshot to keep
/// restored and parked on this host, ready for a fork to claim.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotPoolBody {
    /// 0..8; 0 drops the pool.
    pub size: u64,
}

/// A snapshot's warm pool on this host.
#[derive(Debug, Serialize, ToSchema)]
pub struct SnapshotPool {
    pub snapshot_id: String,
    /// Forks kept ready (0: no pool). A pool no fork used for 15 minutes
    /// is dropped, as is the pool of a deleted snapshot.
    pub size: u64,
    /// Forks ready now (refilled in the background).
    pub ready: u64,
    /// Their sandbox ids: parked, and not among `GET /v1/sandboxes` until
    /// a fork claims one.
    pub sandbox_ids: Vec<String>,
}

impl From<hatchery_core::SnapshotPoolInfo> for SnapshotPool {
    fn from(p: hatchery_core::SnapshotPoolInfo) -> Self {
        SnapshotPool {
            snapshot_id: p.snapshot_id,
            size: p.size as u64,
            ready: p.ready as u64,
            sandbox_ids: p.sandbox_ids,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SandboxList {
    pub sandboxes: Vec<Sandbox>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecBody {
    /// Shell command, run as `/bin/sh -c CMD`. Exactly one of `cmd`, `argv`.
    pub cmd: Option<String>,
    /// Program and arguments, run without a shell.
    pub argv: Option<Vec<String>>,
    /// Absolute working directory (default `/`).
    pub cwd: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Sent to the command's stdin, which is then closed.
    pub stdin: Option<String>,
    /// Deadline in seconds (default 60), enforced from the host.
    pub timeout_seconds: Option<i64>,
    /// Per-stream output cap in bytes (default 1 MiB). A stream that passes
    /// it ends the command (`reason` `output_limit`).
    pub max_output_bytes: Option<i64>,
    /// CPU time of everything the command started, in ms, after which all
    /// of it is killed (`reason` `cpu_limit`). At most the timeout.
    pub cpu_limit_ms: Option<i64>,
    /// Which clock `cpu_limit_ms` is judged on: `guest` (default, the
    /// command's own CPU as the guest counts it, `cpu_ms`) or `host` (the
    /// sandbox's whole CPU as the host counts it, `host_cpu_ms`: steadier
    /// on a busy host, but anything else running in the sandbox counts).
    /// Only with `cpu_limit_ms`, not with `background`.
    pub cpu_limit_basis: Option<CpuLimitBasis>,
    /// Start it and answer at once (202, a `ProcessInfo`); its output is
    /// kept in a ring to read from `/processes/{pid}/output`. Without
    /// `timeout_seconds` it runs as long as the sandbox.
    #[serde(default)]
    pub background: bool,
    /// `text` (default) or `base64` for stdout/stderr (and stream data).
    #[serde(default)]
    pub output: crate::output::OutputEncoding,
}

/// The clock a CPU limit is judged on (see `hatchery_core::exec::CpuBasis`).
#[derive(Debug, Clone, Copy, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum CpuLimitBasis {
    Guest,
    Host,
}

/// Why a command ended.
#[derive(Debug, Clone, Copy, Serialize, ToSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ExecReason {
    /// It exited by itself.
    Exited,
    /// A signal it did not catch ended it (not one of ours).
    Signaled,
    Timeout,
    CpuLimit,
    /// The sandbox's memory ceiling was hit during the command.
    Oom,
    OutputLimit,
    /// The client cancelled it (or disconnected from its stream).
    Cancelled,
}

impl From<hatchery_agent_proto::EndReason> for ExecReason {
    fn from(r: hatchery_agent_proto::EndReason) -> Self {
        use hatchery_agent_proto::EndReason as R;
        match r {
            R::Exited => ExecReason::Exited,
            R::Signaled => ExecReason::Signaled,
            R::Timeout => ExecReason::Timeout,
            R::CpuLimit => ExecReason::CpuLimit,
            R::Oom => ExecReason::Oom,
            R::OutputLimit => ExecReason::OutputLimit,
            R::Cancelled => ExecReason::Cancelled,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ExecResponse {
    /// 128+N if killed by signal N.
    pub exit_code: i32,
    /// UTF-8 (invalid sequences replaced).
    pub stdout: String,
    pub stderr: String,
    pub timed_out: bool,
    pub truncated: bool,
    pub oom_killed: bool,
    pub duration_ms: u64,
    /// CPU time of every process the command started (not of other
    /// commands running in the same sandbox).
    pub cpu_ms: u64,
    pub reason: ExecReason,
    /// Largest memory use seen for the command's processes, sampled.
    pub memory_peak_bytes: Option<u64>,
    /// True when every process the command started was killed with it and
    /// counted in `cpu_ms` (its own cgroup inside the sandbox).
    pub contained: bool,
    /// CPU the host spent on the whole sandbox while the command ran
    /// (everything in it, and the sandbox's own kernel); `null` when the
    /// runtime cannot tell. Steadier than `cpu_ms` on a busy host.
    pub host_cpu_ms: Option<u64>,
}

impl From<ExecOutcome> for ExecResponse {
    fn from(o: ExecOutcome) -> Self {
        Self::encoded(o, crate::output::OutputEncoding::Text)
    }
}

impl ExecResponse {
    pub fn encoded(o: ExecOutcome, enc: crate::output::OutputEncoding) -> Self {
        ExecResponse {
            exit_code: o.exit_code,
            stdout: enc.whole(&o.stdout),
            stderr: enc.whole(&o.stderr),
            timed_out: o.timed_out,
            truncated: o.truncated,
            oom_killed: o.oom_killed,
            duration_ms: o.duration_ms,
            cpu_ms: o.cpu_ms,
            reason: o.reason.into(),
            memory_peak_bytes: o.memory_peak_bytes,
            contained: o.contained,
            host_cpu_ms: o.host_cpu_ms,
        }
    }
}

/// Payload of `stdout` / `stderr` stream events.
#[derive(Debug, Serialize, ToSchema)]
pub struct OutputChunk {
    pub data: String,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PathQuery {
    /// Absolute path inside the sandbox.
    pub path: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct FileEntry {
    pub name: String,
    /// `file`, `dir`, `symlink` or `other`.
    #[serde(rename = "type")]
    pub kind: String,
    pub size: u64,
    pub mode: u32,
    /// Seconds since the epoch.
    pub mtime: i64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct FileList {
    pub path: String,
    pub entries: Vec<FileEntry>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTemplate {
    pub name: String,
    /// Only `debian-bookworm` today.
    pub base: Option<String>,
    /// Debian packages, installed on top of python3 and procps.
    #[serde(default)]
    pub packages: Vec<String>,
    /// Python requirements (`name`, `name==1.2`, `name[extra]>=1`), at most
    /// 64 of at most 200 bytes, installed into the rootfs's `/usr/local` by
    /// the host's pip at rootfs time, from the index the host's pip is
    /// configured for.
    #[serde(default)]
    pub pip: Vec<String>,
    /// Files written before setup: absolute path -> content.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// Shell commands run in the build sandbox; their effects are captured
    /// by the template's checkpoint.
    #[serde(default)]
    pub setup: Vec<String>,
    pub cpus: Option<f64>,
    pub memory_mb: Option<u64>,
    pub pids_max: Option<u32>,
    pub disk_mb: Option<u64>,
    /// Network policy during the build. Builds run offline, so
    /// only `{"egress": "deny"}` (or omitting it) is accepted; packages come
    /// from the host's Debian mirror at rootfs build time.
    pub network: Option<serde_json::Value>,
}

impl CreateTemplate {
    pub fn into_spec(self) -> Result<hatchery_templates::TemplateSpec, ApiError> {
        deny_only_network(self.network.as_ref())?;
        let mut spec = hatchery_templates::TemplateSpec::named(&self.name);
        if let Some(b) = self.base {
            spec.base = b;
        }
        spec.packages = self.packages;
        spec.pip = self.pip;
        spec.files = self.files;
        spec.setup = self.setup;
        spec.cpus = self.cpus.unwrap_or(spec.cpus);
        spec.memory_mb = self.memory_mb.unwrap_or(spec.memory_mb);
        spec.pids_max = self.pids_max.unwrap_or(spec.pids_max);
        spec.disk_mb = self.disk_mb.unwrap_or(spec.disk_mb);
        Ok(spec)
    }
}

/// Template builds run their setup offline (packages come from the
/// host-side rootfs build): a policy other than default-deny cannot be
/// honoured, so it is refused, not ignored.
pub fn deny_only_network(net: Option<&serde_json::Value>) -> Result<(), ApiError> {
    let Some(net) = net else { return Ok(()) };
    let deny_only = net.as_object().is_some_and(|o| {
        o.get("egress").and_then(|v| v.as_str()) == Some("deny")
            && o.keys().all(|k| {
                k == "egress"
                    || ((k == "allow" || k == "deny")
                        && o[k].as_array().is_some_and(|a| a.is_empty()))
            })
    });
    if deny_only {
        Ok(())
    } else {
        Err(ApiError::bad_request(
            "template builds run offline; only {\"network\":{\"egress\":\"deny\"}} is accepted",
        ))
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TemplateInfo {
    pub name: String,
    /// Content hash of the spec.
    pub version: String,
    pub base: String,
    pub packages: Vec<String>,
    /// Python requirements installed into the rootfs.
    pub pip: Vec<String>,
    /// Paths of the template's files.
    pub files: Vec<String>,
    pub setup: Vec<String>,
    pub cpus: f64,
    pub memory_mb: u64,
    pub pids_max: u32,
    pub disk_mb: u64,
    /// Whether the warm checkpoint creates restore from is ready.
    pub checkpoint_ready: bool,
    /// `ready`: creates use `version`. `building`: no version is ready yet
    /// (the fields describe the spec being built); creates answer 503
    /// `template_building` with `Retry-After` until the build is done.
    pub state: TemplateState,
    /// The build of this template in progress (queued or running), if
    /// any: of a new template, or of a new version of a ready one.
    pub build: Option<BuildProgress>,
}

#[derive(Debug, Clone, Copy, Serialize, ToSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum TemplateState {
    Ready,
    Building,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct BuildProgress {
    pub build_id: String,
    /// The version the build will activate.
    pub version: String,
    /// `queued` (waiting for the builds before it), `rootfs`, `setup` or
    /// `activate`.
    pub step: String,
    pub percent: u32,
    /// The build's server-sent events, from the start.
    pub events_url: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TemplateList {
    pub templates: Vec<TemplateInfo>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct BuildAccepted {
    pub build_id: String,
    pub name: String,
    /// The version this build will activate.
    pub version: String,
    /// Server-sent events: `step` {step, percent}, `log` {line}, then
    /// `done` {name, version} or `error` {error}.
    pub events_url: String,
}

/// `v` if it is in 1..=max, `default` if absent; the one bound check for
/// every numeric field (TTLs, timeouts, byte caps, counts).
pub fn bounded(v: Option<i64>, default: u64, max: u64, name: &str) -> Result<u64, ApiError> {
    match v {
        None => Ok(default),
        Some(s) if s >= 1 && (s as u64) <= max => Ok(s as u64),
        Some(_) => Err(ApiError::bad_request(format!(
            "{name} must be between 1 and {max}"
        ))),
    }
}

/// A CPU limit is 1 ms up to the whole deadline (`timeout_s`).
pub fn validate_cpu_limit(v: Option<i64>, timeout_s: u64) -> Result<Option<u64>, ApiError> {
    match v {
        None => Ok(None),
        Some(ms) if ms >= 1 && (ms as u64) <= timeout_s * 1000 => Ok(Some(ms as u64)),
        Some(_) => Err(ApiError::bad_request(format!(
            "cpu_limit_ms must be between 1 and the timeout ({} ms)",
            timeout_s * 1000
        ))),
    }
}

pub fn validate_ttl(v: Option<i64>, caps: &Caps) -> Result<u64, ApiError> {
    bounded(v, caps.default_ttl_s, caps.max_ttl_s, "ttl_seconds")
}

pub fn validate_metadata(md: &BTreeMap<String, String>, caps: &Caps) -> Result<(), ApiError> {
    if md.len() > caps.max_metadata_entries {
        return Err(ApiError::bad_request(format!(
            "metadata has over {} entries",
            caps.max_metadata_entries
        )));
    }
    for (k, v) in md {
        if k.is_empty() || k.len() > caps.max_metadata_key {
            return Err(ApiError::bad_request(format!(
                "metadata keys must be 1..={} bytes",
                caps.max_metadata_key
            )));
        }
        if v.len() > caps.max_metadata_value {
            return Err(ApiError::bad_request(format!(
                "metadata values must be at most {} bytes",
                caps.max_metadata_value
            )));
        }
    }
    Ok(())
}

pub fn validate_env(env: &BTreeMap<String, String>, caps: &Caps) -> Result<(), ApiError> {
    if env.len() > caps.max_env_entries {
        return Err(ApiError::bad_request(format!(
            "env has over {} entries",
            caps.max_env_entries
        )));
    }
    let mut total = 0;
    for (k, v) in env {
        let valid_key = !k.is_empty()
            && !k.as_bytes()[0].is_ascii_digit()
            && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !valid_key {
            return Err(ApiError::bad_request(format!(
                "env name {k:?} must match [A-Za-z_][A-Za-z0-9_]*"
            )));
        }
        if v.contains('\0') {
            return Err(ApiError::bad_request(format!("env {k} contains NUL")));
        }
        total += k.len() + v.len();
    }
    if total > caps.max_env_bytes {
        return Err(ApiError::bad_request(format!(
            "env is over {} bytes",
            caps.max_env_bytes
        )));
    }
    Ok(())
}

/// The command line of an exec or a terminal: a shell `cmd` or an `argv`,
/// not both, within the caps and without NUL. `None` when neither is given.
pub fn command_line(
    cmd: Option<String>,
    argv: Option<Vec<String>>,
    caps: &Caps,
) -> Result<Option<Vec<String>>, ApiError> {
    let argv = match (cmd, argv) {
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_request("give either cmd or argv, not both"))
        }
        (None, None) => return Ok(None),
        (Some(cmd), None) => {
            if cmd.trim().is_empty() {
                return Err(ApiError::bad_request("cmd is empty"));
            }
            if cmd.len() > caps.max_cmd_bytes {
                return Err(ApiError::bad_request(format!(
                    "cmd is over {} bytes",
                    caps.max_cmd_bytes
                )));
            }
            vec!["/bin/sh".to_string(), "-c".to_string(), cmd]
        }
        (None, Some(argv)) => {
            if argv.is_empty() || argv[0].is_empty() {
                return Err(ApiError::bad_request("argv is empty"));
            }
            if argv.len() > caps.max_argv
                || argv.iter().map(|a| a.len()).sum::<usize>() > caps.max_cmd_bytes
            {
                return Err(ApiError::bad_request("argv is too long"));
            }
            argv
        }
    };
    if argv.iter().any(|a| a.contains('\0')) {
        return Err(ApiError::bad_request("command contains NUL"));
    }
    Ok(Some(argv))
}

impl ExecBody {
    pub fn into_params(self, caps: &Caps) -> Result<ExecParams, ApiError> {
        let argv = command_line(self.cmd, self.argv, caps)?
            .ok_or_else(|| ApiError::bad_request("cmd or argv is required"))?;
        if let Some(cwd) = &self.cwd {
            hatchery_core::files::validate_path(cwd, caps.max_path_bytes)
                .map_err(|e| ApiError::bad_request(e.to_string()))?;
        }
        validate_env(&self.env, caps)?;
        if self
            .stdin
            .as_ref()
            .is_some_and(|s| s.len() as u64 > caps.max_stdin_bytes)
        {
            return Err(ApiError::bad_request(format!(
                "stdin is over {} bytes",
                caps.max_stdin_bytes
            )));
        }
        let timeout = bounded(
            self.timeout_seconds,
            caps.default_exec_timeout_s,
            caps.max_exec_timeout_s,
            "timeout_seconds",
        )?;
        let max_output_bytes = bounded(
            self.max_output_bytes,
            caps.default_output_bytes,
            caps.max_output_bytes,
            "max_output_bytes",
        )?;
        let cpu_limit_ms = validate_cpu_limit(self.cpu_limit_ms, timeout)?;
        let cpu_basis = match (self.cpu_limit_basis, cpu_limit_ms) {
            (None | Some(CpuLimitBasis::Guest), _) => hatchery_core::exec::CpuBasis::Guest,
            (Some(CpuLimitBasis::Host), Some(_)) => hatchery_core::exec::CpuBasis::Host,
            (Some(CpuLimitBasis::Host), None) => {
                return Err(ApiError::bad_request(
                    "cpu_limit_basis needs cpu_limit_ms".to_string(),
                ))
            }
        };
        Ok(ExecParams {
            argv,
            cwd: self.cwd,
            env: self.env,
            stdin: self.stdin,
            timeout: Duration::from_secs(timeout),
            max_output_bytes,
            cpu_limit_ms,
            cpu_basis,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(v: serde_json::Value) -> Result<ExecParams, ApiError> {
        serde_json::from_value::<ExecBody>(v)
            .unwrap()
            .into_params(&Caps::default())
    }

    #[test]
    fn exec_body_rules() {
        let p = body(serde_json::json!({"cmd": "echo hi"})).unwrap();
        assert_eq!(p.argv, ["/bin/sh", "-c", "echo hi"]);
        assert_eq!(p.timeout, Duration::from_secs(60));
        assert!(body(serde_json::json!({"cmd": "  "})).is_err());
        assert!(body(serde_json::json!({})).is_err());
        assert!(body(serde_json::json!({"cmd": "a", "argv": ["b"]})).is_err());
        assert!(body(serde_json::json!({"argv": []})).is_err());
        assert!(body(serde_json::json!({"cmd": "a", "timeout_seconds": 0})).is_err());
        assert!(body(serde_json::json!({"cmd": "a", "timeout_seconds": 3601})).is_err());
        assert!(body(serde_json::json!({"cmd": "a", "timeout_seconds": 3600})).is_ok());
        assert!(body(serde_json::json!({"cmd": "a", "max_output_bytes": 0})).is_err());
        assert!(body(serde_json::json!({"cmd": "a", "cwd": "rel"})).is_err());
        assert!(body(serde_json::json!({"cmd": "a", "env": {"1X": "v"}})).is_err());
        assert!(serde_json::from_value::<ExecBody>(serde_json::json!({"command": "a"})).is_err());
    }

    #[test]
    fn ttl_and_metadata_bounds() {
        let caps = Caps::default();
        assert_eq!(validate_ttl(None, &caps).unwrap(), 300);
        assert!(validate_ttl(Some(0), &caps).is_err());
        assert!(validate_ttl(Some(-5), &caps).is_err());
        assert!(validate_ttl(Some(caps.max_ttl_s as i64), &caps).is_ok());
        assert!(validate_ttl(Some(caps.max_ttl_s as i64 + 1), &caps).is_err());
        let mut md = BTreeMap::new();
        md.insert(
            "k".repeat(caps.max_metadata_key),
            "v".repeat(caps.max_metadata_value),
        );
        assert!(validate_metadata(&md, &caps).is_ok());
        md.insert("x".into(), "v".repeat(caps.max_metadata_value + 1));
        assert!(validate_metadata(&md, &caps).is_err());
    }
}
