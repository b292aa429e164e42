//! Creating a round: validate everything, then prepare once: a sandbox of
//! the pinned template version gets the starter files and runs the setup
//! commands (with the setup-only egress allow list), egress is closed, and
//! the prepared snapshot every candidate and grader forks from is taken.
//! The round row is written only once all of that worked, so a failed
//! create leaves nothing behind.

use crate::ids::{new_id, now_ms, rfc3339, valid_id};
use crate::limits::*;
use crate::models::*;
use crate::sandbox::{ExecSpec, NewSandbox};
use crate::state::RoundState;
use crate::store::RoundRecord;
use crate::{Rounds, RoundsError};
use std::collections::BTreeMap;

/// A validated create request.
struct Checked {
    name: String,
    template: String,
    pinned: Option<String>,
    spec: RoundSpec,
    suite: TestSuite,
    reference: Option<BTreeMap<String, String>>,
}

fn check(body: CreateRound) -> Result<Checked, RoundsError> {
    let name = body.name.trim().to_string();
    if name.is_empty() || name.len() > MAX_NAME_BYTES {
        return Err(RoundsError::Invalid(format!(
            "name must be 1..{MAX_NAME_BYTES} bytes"
        )));
    }
    check_files("starter_files", &body.starter_files, MAX_STARTER_BYTES)?;
    check_files("tests.files", &body.tests.files, MAX_TESTS_BYTES)?;
    if let Some(r) = &body.reference_solution {
        check_files("reference_solution", r, MAX_RUN_BYTES)?;
        if r.is_empty() {
            return Err(RoundsError::Invalid(
                "reference_solution must name at least one file".into(),
            ));
        }
    }
    if body.tests.files.is_empty() {
        return Err(RoundsError::Invalid("tests.files must not be empty".into()));
    }
    let runner = body
        .tests
        .runner
        .as_ref()
        .map(|v| check_argv("tests.runner", v))
        .transpose()?;
    let run = match &body.run {
        Some(v) => check_argv("run", v)?,
        None => vec!["python3".into(), "solution.py".into()],
    };
    let cpu = within(
        "cpu_time_limit_ms",
        body.cpu_time_limit_ms,
        1,
        MAX_CPU_LIMIT_MS,
    )?;
    let wall = match body.wall_time_limit_ms {
        Some(w) => within(
            "wall_time_limit_ms",
            w,
            cpu.max(MIN_WALL_LIMIT_MS),
            MAX_WALL_LIMIT_MS,
        )?,
        None => (cpu * 3).max(MIN_WALL_LIMIT_MS),
    };
    // The host's deadline is whole seconds: round up, never down.
    let wall = wall.div_ceil(1000) * 1000;
    let output = within(
        "output_limit_bytes",
        body.output_limit_bytes.unwrap_or(DEFAULT_OUTPUT_LIMIT),
        1,
        MAX_OUTPUT_LIMIT,
    )?;
    let retention = within(
        "retention_seconds",
        body.retention_seconds.unwrap_or(DEFAULT_RETENTION_S),
        1,
        MAX_RETENTION_S,
    )?;
    let session = within(
        "session_seconds",
        body.session_seconds.unwrap_or(DEFAULT_SESSION_S),
        MIN_SESSION_S,
        MAX_SESSION_S,
    )?;
    let (commands, allow) = match body.setup {
        Some(s) => (s.commands, s.allow),
        None => (vec![], vec![]),
    };
    if commands.len() > MAX_SETUP_COMMANDS
        || commands
            .iter()
            .any(|c| c.trim().is_empty() || c.len() > MAX_SETUP_COMMAND_BYTES)
    {
        return Err(RoundsError::Invalid(format!(
            "setup.commands: at most {MAX_SETUP_COMMANDS}, each non-blank and at most {MAX_SETUP_COMMAND_BYTES} bytes"
        )));
    }
    if allow.len() > 64 || allow.iter().any(|r| !r.is_object()) {
        return Err(RoundsError::Invalid(
            "setup.allow: at most 64 NetworkPolicy rules (objects)".into(),
        ));
    }
    let template = body
        .template
        .unwrap_or_else(|| "code-interpreter".to_string());
    if template.is_empty()
        || template.len() > 64
        || !template
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err(RoundsError::Invalid(format!(
            "template {template:?}: use 1-64 of [a-z0-9-]"
        )));
    }
    Ok(Checked {
        name,
        template,
        pinned: body.template_version,
        spec: RoundSpec {
            test_files: body.tests.files.keys().cloned().collect(),
            custom_runner: runner.is_some(),
            starter_files: body.starter_files,
            run,
            cpu_time_limit_ms: cpu,
            wall_time_limit_ms: wall,
            memory_limit_mb: body.memory_limit_mb.unwrap_or(0),
            output_limit_bytes: output,
            run_mode: body.run_mode.unwrap_or_default(),
            setup_commands: commands,
            setup_allow: allow,
            retention_seconds: retention,
            session_seconds: session,
            reference_cpu_ms: None,
        },
        suite: TestSuite {
            files: body.tests.files,
            runner,
        },
        reference: body.reference_solution,
    })
}

pub(crate) fn spec_of(r: &RoundRecord) -> Result<RoundSpec, RoundsError> {
    serde_json::from_str(&r.spec).map_err(|e| RoundsError::Internal(format!("round spec: {e}")))
}

pub(crate) fn view(r: &RoundRecord) -> Result<Round, RoundsError> {
    Ok(Round {
        id: r.id.clone(),
        name: r.name.clone(),
        state: r.state,
        template: r.template.clone(),
        template_version: r.template_version.clone(),
        spec: spec_of(r)?,
        created_at: rfc3339(r.created_at_ms),
        error: r.error.clone(),
        tenant: r.tenant.clone(),
    })
}

impl Rounds {
    /// `tenant`: the caller's tenant (`None`: the operator), recorded on
    /// the round.
    pub async fn create_round(
        &self,
        body: CreateRound,
        tenant: Option<&str>,
    ) -> Result<Round, RoundsError> {
        let mut c = check(body)?;
        let tpl = self.sandboxes.template(&c.template).await?;
        if let Some(v) = &c.pinned {
            if *v != tpl.version {
                return Err(RoundsError::TemplateVersionGone {
                    template: c.template,
                    version: v.clone(),
                    why: format!("the template's current version is {}", tpl.version),
                });
            }
        }
        let template_mb = tpl.memory_mb;
        if c.spec.memory_limit_mb == 0 {
            c.spec.memory_limit_mb = template_mb;
        } else {
            within("memory_limit_mb", c.spec.memory_limit_mb, 16, template_mb)?;
        }
        let id = new_id("rnd");
        let (snapshot, reference_cpu_ms) = self.prepare(&id, &c, &tpl.version, tenant).await?;
        c.spec.reference_cpu_ms = reference_cpu_ms;
        let rec = RoundRecord {
            id: id.clone(),
            name: c.name,
            state: RoundState::Ready,
            template: c.template,
            template_version: tpl.version,
            spec: serde_json::to_string(&c.spec)
                .map_err(|e| RoundsError::Internal(e.to_string()))?,
            tests: serde_json::to_string(&c.suite)
                .map_err(|e| RoundsError::Internal(e.to_string()))?,
            prepared_snapshot: Some(snapshot.clone()),
            error: None,
            created_at_ms: now_ms(),
            tenant: tenant.map(str::to_string),
        };
        if let Err(e) = self.store.insert_round(&rec).await {
            let _ = self.sandboxes.delete_snapshot(&snapshot).await;
            return Err(e.into());
        }
        tracing::info!(round = %id, template = %rec.template, version = %rec.template_version, "round ready");
        view(&rec)
    }

    /// Returns the prepared snapshot's id and the reference solution's CPU;
    /// on failure nothing is left.
    async fn prepare(
        &self,
        id: &str,
        c: &Checked,
        version: &str,
        tenant: Option<&str>,
    ) -> Result<(String, Option<u64>), RoundsError> {
        let network = if c.spec.setup_allow.is_empty() {
            None
        } else {
            Some(serde_json::json!({"egress": "deny", "allow": c.spec.setup_allow}))
        };
        let metadata = self.own_meta(&[("round", id), ("kind", "round-prepare")]);
        let ttl = 300 + c.spec.setup_commands.len() as u64 * SETUP_TIMEOUT_S;
        let sbx = self
            .sandboxes
            .create(NewSandbox {
                template: c.template.clone(),
                ttl_seconds: ttl,
                // The tenant's only on the sandbox: the prepared snapshot
                // stays the rounds' own (metadata below, without it).
                metadata: crate::tenant_meta::of_tenant(metadata.clone(), tenant),
                network,
            })
            .await
            .map_err(|e| match e.code() {
                "invalid_network_policy" => RoundsError::Invalid(format!("setup.allow: {e}")),
                _ => e.into(),
            })?;
        let mut res = self
            .prepare_in(&sbx, c, version, metadata)
            .await
            .map(|snap| (snap, None));
        if let (Ok((snap, cpu)), Some(files)) = (&mut res, &c.reference) {
            // After the snapshot, so no candidate ever sees the reference.
            match self.run_reference(&sbx, &c.spec, files).await {
                Ok(ms) => *cpu = Some(ms),
                Err(e) => {
                    if let Err(d) = self.sandboxes.delete_snapshot(snap).await {
                        tracing::warn!(snapshot = %snap, error = %d, "rounds: deleting a refused round's snapshot failed");
                    }
                    res = Err(e);
                }
            }
        }
        // The preparing sandbox is never handed to anyone.
        if let Err(e) = self.sandboxes.delete(&sbx).await {
            tracing::warn!(sandbox = %sbx, error = %e, "rounds: deleting the preparing sandbox failed");
        }
        res
    }

    async fn prepare_in(
        &self,
        sbx: &str,
        c: &Checked,
        version: &str,
        mut metadata: BTreeMap<String, String>,
    ) -> Result<String, RoundsError> {
        let sh = |cmd: &str, timeout: u64| ExecSpec {
            argv: vec!["/bin/sh".into(), "-c".into(), cmd.into()],
            cwd: "/".into(),
            env: BTreeMap::new(),
            timeout_seconds: timeout,
            cpu_limit_ms: None,
            cpu_on_host: false,
            max_output_bytes: 64 << 10,
        };
        let mk = self
            .sandboxes
            .exec(sbx, sh(&format!("mkdir -p {WORKDIR}"), 30))
            .await?;
        if mk.exit_code != 0 {
            return Err(RoundsError::Internal(format!(
                "mkdir {WORKDIR}: {}",
                mk.stderr
            )));
        }
        for (path, text) in &c.spec.starter_files {
            self.sandboxes
                .write_file(sbx, &format!("{WORKDIR}/{path}"), text.as_bytes().to_vec())
                .await?;
        }
        for (i, cmd) in c.spec.setup_commands.iter().enumerate() {
            let mut spec = sh(cmd, SETUP_TIMEOUT_S);
            spec.cwd = WORKDIR.into();
            let o = self.sandboxes.exec(sbx, spec).await?;
            if o.exit_code != 0 || o.reason != "exited" {
                return Err(RoundsError::state(
                    "setup_failed",
                    format!(
                        "setup.commands[{i}] ended with {} ({}): {}",
                        o.exit_code,
                        o.reason,
                        crate::verdict::tail(&o.stderr, 2000)
                    ),
                ));
            }
        }
        // Closed before the snapshot, so no fork ever starts with the
        // setup's holes (forks get deny-all anyway).
        if !c.spec.setup_allow.is_empty() {
            self.sandboxes
                .set_network(sbx, serde_json::json!({"egress": "deny"}))
                .await?;
        }
        metadata.insert("hatchery.template_version".into(), version.into());
        Ok(self
            .sandboxes
            .snapshot(sbx, MAX_RETENTION_S, metadata)
            .await?)
    }

    pub async fn round(&self, id: &str) -> Result<RoundRecord, RoundsError> {
        if !valid_id("rnd", id) {
            return Err(RoundsError::NotFound(format!("round {id}")));
        }
        self.store
            .get_round(id)
            .await?
            .ok_or_else(|| RoundsError::NotFound(format!("round {id}")))
    }

    /// Every round, or only `tenant`'s.
    pub async fn list_rounds(&self, tenant: Option<&str>) -> Result<Vec<Round>, RoundsError> {
        let rounds = self.store.list_rounds().await?;
        rounds
            .iter()
            .filter(|r| tenant.is_none() || r.tenant.as_deref() == tenant)
            .map(view)
            .collect()
    }

    pub async fn archive_round(&self, id: &str) -> Result<Round, RoundsError> {
        let r = self.round(id).await?;
        if r.state != RoundState::Archived
            && !self
                .store
                .set_round_state(
                    id,
                    &RoundState::sources(RoundState::Archived),
                    RoundState::Archived,
                    None,
                    None,
                )
                .await?
        {
            return Err(RoundsError::state(
                "invalid_state",
                format!("round {id} cannot be archived from {}", r.state.as_str()),
            ));
        }
        view(&self.round(id).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(v: serde_json::Value) -> CreateRound {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn defaults_and_bounds() {
        let c = check(body(serde_json::json!({
            "name": "r", "tests": {"files": {"test_a.py": "def test_x(): pass"}},
            "cpu_time_limit_ms": 2000
        })))
        .unwrap();
        assert_eq!(c.spec.wall_time_limit_ms, 6000, "3x the CPU limit");
        assert_eq!(c.spec.run, ["python3", "solution.py"]);
        let c = check(body(serde_json::json!({
            "name": "r", "tests": {"files": {"t.py": ""}}, "cpu_time_limit_ms": 1500,
            "wall_time_limit_ms": 2500
        })))
        .unwrap();
        assert_eq!(
            c.spec.wall_time_limit_ms, 3000,
            "rounded up to whole seconds"
        );
        for bad in [
            serde_json::json!({"name": "r", "tests": {"files": {"t.py": ""}}, "cpu_time_limit_ms": 0}),
            serde_json::json!({"name": "r", "tests": {"files": {"t.py": ""}}, "cpu_time_limit_ms": 2000, "wall_time_limit_ms": 1000}),
            serde_json::json!({"name": "r", "tests": {"files": {"../t.py": ""}}, "cpu_time_limit_ms": 1}),
            serde_json::json!({"name": "r", "tests": {"files": {"t.py": ""}, "runner": "sh -c 'x'"}, "cpu_time_limit_ms": 1}),
            serde_json::json!({"name": "r", "tests": {"files": {}}, "cpu_time_limit_ms": 1}),
            serde_json::json!({"name": "", "tests": {"files": {"t.py": ""}}, "cpu_time_limit_ms": 1}),
            serde_json::json!({"name": "r", "template": "../x", "tests": {"files": {"t.py": ""}}, "cpu_time_limit_ms": 1}),
        ] {
            assert!(
                matches!(check(body(bad.clone())), Err(RoundsError::Invalid(_))),
                "{bad}"
            );
        }
        let big = "x".repeat(MAX_TESTS_BYTES + 1);
        assert!(matches!(
            check(body(
                serde_json::json!({"name": "r", "tests": {"files": {"t.py": big}}, "cpu_time_limit_ms": 1})
            )),
            Err(RoundsError::TooLarge(_))
        ));
    }
}
