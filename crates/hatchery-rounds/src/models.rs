//! Wire types of `/v1/rounds`. Requests deny unknown fields; the OpenAPI
//! document is generated from these.

use crate::state::{RoundState, SessionState};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, Default)]
#[serde(rename_all = "snake_case")]
pub enum RunMode {
    /// Run in the candidate's own persistent sandbox.
    #[default]
    Session,
    /// Each Run in a fresh fork of the round's prepared snapshot.
    Fresh,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TestSuiteBody {
    /// The hidden tests, `{relative path: text}`. Stored on the control
    /// side only; written into grader sandboxes only.
    pub files: BTreeMap<String, String>,
    /// Argv of your own runner (never a shell string). Without it the
    /// built-in runner discovers the `test_*` functions.
    #[schema(value_type = Option<Vec<String>>)]
    pub runner: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetupBody {
    /// Shell commands run once, in order, in `/work` of the preparing
    /// sandbox (600 s each). Written by the round's author, not candidates.
    #[serde(default)]
    pub commands: Vec<String>,
    /// Egress allowed during setup only: NetworkPolicy `allow` rules.
    /// Closed (deny-all) before the prepared snapshot is taken.
    #[serde(default)]
    #[schema(value_type = Vec<Object>)]
    pub allow: Vec<serde_json::Value>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateRound {
    pub name: String,
    #[serde(default)]
    pub template: Option<String>,
    /// Pin: the template's current version must be this one.
    #[serde(default)]
    pub template_version: Option<String>,
    #[serde(default)]
    pub starter_files: BTreeMap<String, String>,
    pub tests: TestSuiteBody,
    /// Argv of Run, in `/work`. Default `["python3", "solution.py"]`.
    #[serde(default)]
    #[schema(value_type = Option<Vec<String>>)]
    pub run: Option<serde_json::Value>,
    /// CPU time a Run (and each graded case) may use: the pass/fail measure.
    pub cpu_time_limit_ms: u64,
    /// Wall-clock safety net, whole seconds (rounded up); default 3× CPU.
    #[serde(default)]
    pub wall_time_limit_ms: Option<u64>,
    /// Memory verdict threshold; default and maximum the template's memory.
    #[serde(default)]
    pub memory_limit_mb: Option<u64>,
    /// Per stream; more ends the Run with `output_limit`. Default 1 MiB.
    #[serde(default)]
    pub output_limit_bytes: Option<u64>,
    #[serde(default)]
    pub run_mode: Option<RunMode>,
    #[serde(default)]
    pub setup: Option<SetupBody>,
    /// How long replays are kept. Default 7 days.
    #[serde(default)]
    pub retention_seconds: Option<u64>,
    /// How long a candidate session lasts. Default 3600.
    #[serde(default)]
    pub session_seconds: Option<u64>,
    /// Files of a known-good solution, laid over the starter files and run
    /// at prepare time ([`REFERENCE_RUNS`](crate::limits::REFERENCE_RUNS)
    /// times, with the round's `run` and limits). The round is refused
    /// (`limit_too_tight`) unless `cpu_time_limit_ms` is at least 1.5× the
    /// most CPU any of those runs took, because CPU time under systrap on a
    /// shared host varies by up to 3× (docs/interviews.md#fairness).
    #[serde(default)]
    pub reference_solution: Option<BTreeMap<String, String>>,
}

/// The round as stored (everything but the hidden tests' contents).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RoundSpec {
    pub starter_files: BTreeMap<String, String>,
    pub run: Vec<String>,
    pub cpu_time_limit_ms: u64,
    pub wall_time_limit_ms: u64,
    pub memory_limit_mb: u64,
    pub output_limit_bytes: u64,
    pub run_mode: RunMode,
    pub setup_commands: Vec<String>,
    pub setup_allow: Vec<serde_json::Value>,
    pub retention_seconds: u64,
    pub session_seconds: u64,
    /// The most CPU the reference solution took over its prepare-time
    /// runs; absent when the round has no reference solution.
    #[serde(default)]
    pub reference_cpu_ms: Option<u64>,
    /// Names only; the contents never leave the control side.
    pub test_files: Vec<String>,
    pub custom_runner: bool,
}

/// The hidden suite, as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TestSuite {
    pub files: BTreeMap<String, String>,
    pub runner: Option<Vec<String>>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Round {
    pub id: String,
    pub name: String,
    pub state: RoundState,
    pub template: String,
    pub template_version: String,
    #[serde(flatten)]
    pub spec: RoundSpec,
    pub created_at: String,
    pub error: Option<String>,
    /// The tenant whose key made the round; absent for the operator's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct RoundList {
    pub rounds: Vec<Round>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSession {
    /// Who this is (a name or an email): shown to reviewers.
    pub candidate: String,
}

/// What the candidate sees of a grading: counts and case names, never
/// assertion text or output.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct CandidateResult {
    pub submission_id: String,
    pub passed: u32,
    pub total: u32,
    pub failed_cases: Vec<String>,
    /// `graded`, or `error` when the grader itself could not run.
    pub status: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Session {
    pub id: String,
    pub round_id: String,
    pub candidate: String,
    pub state: SessionState,
    pub created_at: String,
    pub expires_at: String,
    pub result: Option<CandidateResult>,
    /// The candidate's files (names), and the Run command and limits.
    pub files: Vec<String>,
    pub run: Vec<String>,
    pub run_mode: RunMode,
    pub cpu_time_limit_ms: u64,
    pub wall_time_limit_ms: u64,
    pub round_name: String,
    pub error: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SessionCreated {
    #[serde(flatten)]
    pub session: Session,
    /// The candidate's capability token (shown once).
    pub token: String,
    /// The candidate room; the token rides in the fragment, which
    /// browsers never send to a server.
    pub url: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SessionList {
    pub sessions: Vec<Session>,
}

#[derive(Debug, Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct RunBody {
    /// Files to write into `/work` before the Run, `{path: text}`.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Ok,
    RuntimeError,
    /// Over the CPU time limit.
    TimeLimit,
    /// Over the wall-clock safety net.
    WallLimit,
    MemoryLimit,
    OutputLimit,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct RunResult {
    pub run_id: String,
    /// The last 16 kB.
    pub stdout: String,
    /// The last 4 kB.
    pub stderr: String,
    pub exit_code: i64,
    pub cpu_ms: u64,
    pub wall_ms: u64,
    pub memory_peak_bytes: u64,
    pub verdict: Verdict,
    /// Why the process ended (exec `reason`).
    pub reason: String,
    pub truncated: bool,
    pub created_at: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct RunList {
    pub runs: Vec<RunResult>,
}

#[derive(Debug, Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct SubmitBody {
    /// Written into `/work` first, then everything there is captured.
    #[serde(default)]
    pub files: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SubmitAccepted {
    pub submission_id: String,
    /// SHA-256 over the captured files (path and content, length-prefixed).
    pub sha256: String,
    pub state: SessionState,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct CaseReport {
    pub name: String,
    pub ok: bool,
    /// Assertion text or traceback: reviewer only.
    pub detail: String,
    #[serde(default)]
    pub cpu_ms: Option<f64>,
    #[serde(default)]
    pub wall_ms: Option<f64>,
}

/// The full grading, for reviewers.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct GradingReport {
    pub grading_id: String,
    pub status: String,
    pub passed: u32,
    pub total: u32,
    pub cases: Vec<CaseReport>,
    pub stdout: String,
    pub stderr: String,
    pub exit_code: i64,
    pub cpu_ms: u64,
    pub wall_ms: u64,
    pub reason: String,
    pub error: Option<String>,
    pub graded_at: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SubmissionReport {
    pub submission_id: String,
    pub sha256: String,
    pub submitted_at: String,
    /// `{path: sha256}` of what was captured.
    pub files: BTreeMap<String, String>,
    /// Every grading of this submission, first one first (regrades after).
    pub gradings: Vec<GradingReport>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Report {
    pub session_id: String,
    pub candidate: String,
    pub state: SessionState,
    pub submissions: Vec<SubmissionReport>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SubmissionFiles {
    pub submission_id: String,
    pub sha256: String,
    pub files: BTreeMap<String, String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Replay {
    pub id: String,
    pub session_id: String,
    pub round_id: String,
    pub snapshot_id: String,
    /// `end` or `on_demand`.
    pub reason: String,
    pub created_at: String,
    pub expires_at: String,
    /// `active`, or `expired` once the retention window closed (the
    /// snapshot is then deleted).
    pub state: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ReplayList {
    pub replays: Vec<Replay>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Fork {
    pub id: String,
    pub replay_id: String,
    pub sandbox_id: String,
    pub created_at: String,
    pub expires_at: String,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkExecBody {
    /// Argv, run in `/work` of the fork.
    pub argv: Vec<String>,
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ForkExecResult {
    pub stdout: String,
    pub stderr: String,
    pub exit_code: i64,
    pub reason: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct FileContent {
    pub path: String,
    pub content: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct FileTree {
    /// Paths relative to `/work`, files only.
    pub files: Vec<String>,
}

#[derive(Debug, Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct CreateReviewerToken {
    /// Lifetime, default 7 days, at most 90.
    #[serde(default)]
    pub ttl_seconds: Option<u64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ReviewerToken {
    pub token: String,
    pub expires_at: String,
    pub url: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TerminalGrant {
    /// Open `ws(s)://HOST/v1/sandboxes/{sandbox_id}/pty?token=TOKEN` once,
    /// within 60 s.
    pub sandbox_id: String,
    pub token: String,
    pub expires_at: String,
}

/// The interviewers' private notes on a session.
#[derive(Debug, Serialize, Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct NotesBody {
    /// At most 64 KiB.
    pub text: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Notes {
    pub text: String,
    /// Who saved them last (`interviewer:<id>`, `api_key`); empty if never.
    pub author: String,
    pub updated_at: Option<String>,
}

/// The room's pairing switch: interviewers type too, or only watch.
#[derive(Debug, Serialize, Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct Pairing {
    pub pairing: bool,
}

/// One entry of a session's room log, for playback.
#[derive(Debug, Serialize, ToSchema)]
pub struct TimelineEntry {
    /// Its place in the log, from 0 (the seed).
    pub idx: u64,
    /// `seed`, `update`, `run` or `submit`.
    pub kind: String,
    /// `server`, `candidate`, `interviewer:<id>`, `api_key`.
    pub author: String,
    /// The Run's id (see `/runs`) or the submission's id, for a marker.
    pub ref_id: Option<String>,
    pub at: String,
    pub at_ms: u64,
    /// Size of the update (0 for a marker).
    pub bytes: u64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Timeline {
    pub entries: Vec<TimelineEntry>,
}

/// The room's files as they were right after log entry `idx`.
#[derive(Debug, Serialize, ToSchema)]
pub struct DocumentAt {
    pub idx: u64,
    pub files: BTreeMap<String, String>,
}
