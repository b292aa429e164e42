//! Where things live in a session's sandbox, and the template a session
//! or an environment gets by default: shared by the runner and the
//! environments' builds, in a module of its own so that neither imports
//! the other.

/// The checkout.
pub const WORKDIR: &str = "/workspace";
/// Hatchery's own files in the sandbox: the agent, its config, the tar
/// the final diff is made against, an environment's delta.
pub const AGENT_DIR: &str = "/opt/hatchery";
/// An environment snapshot's tracked paths at its base commit
/// (NUL-separated), what a session's delta is applied against.
pub const TRACKED_FILE: &str = "/opt/hatchery/env-tracked";
pub const DEFAULT_TEMPLATE: &str = "code-interpreter";
