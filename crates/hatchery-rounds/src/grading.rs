//! Submit and grading. Capture first: the candidate's files are read out
//! of their sandbox and stored with their SHA-256 and time; later edits
//! change the session, not what is graded. Then a fresh grader, forked
//! from the round's prepared snapshot (no candidate ever had a shell on
//! it), gets the captured files and, only there, the hidden tests; it runs
//! with deny-all egress and the round's limits, and is always destroyed.

use crate::ids::{new_id, now_ms, rfc3339, valid_id};
use crate::limits::*;
use crate::models::*;
use crate::round_ops::spec_of;
use crate::sandbox::ExecSpec;
use crate::session_ops::{files_sha256, fork_error, hex};
use crate::state::{refusal, SessionState};
use crate::store::{GradingRecord, RoundRecord, SessionRecord, SubmissionRecord};
use crate::{Rounds, RoundsError};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::sync::Arc;

const RUNNER: &str = include_str!("../runner/run_tests.py");
const MAX_CASES: usize = 1000;
const MAX_CASE_NAME: usize = 200;
const MAX_CASE_DETAIL: usize = 4000;

/// The report a runner writes, as read back (then bounded and recounted).
#[derive(serde::Deserialize)]
struct RawReport {
    cases: Vec<RawCase>,
}

#[derive(serde::Deserialize)]
struct RawCase {
    name: String,
    ok: bool,
    #[serde(default)]
    detail: String,
    #[serde(default)]
    cpu_ms: Option<f64>,
    #[serde(default)]
    wall_ms: Option<f64>,
}

/// Counts come from the cases themselves, so a runner cannot report more
/// passes than it has passing cases.
fn parse_report(raw: &[u8]) -> Result<Vec<CaseReport>, String> {
    let r: RawReport = serde_json::from_slice(raw).map_err(|e| format!("report.json: {e}"))?;
    if r.cases.len() > MAX_CASES {
        return Err(format!("report.json: more than {MAX_CASES} cases"));
    }
    Ok(r.cases
        .into_iter()
        .map(|c| CaseReport {
            name: crate::verdict::tail(&c.name, MAX_CASE_NAME),
            ok: c.ok,
            detail: crate::verdict::tail(&c.detail, MAX_CASE_DETAIL),
            cpu_ms: c.cpu_ms,
            wall_ms: c.wall_ms,
        })
        .collect())
}

impl Rounds {
    pub async fn submit(
        self: &Arc<Self>,
        round_id: &str,
        session_id: &str,
        body: SubmitBody,
    ) -> Result<SubmitAccepted, RoundsError> {
        if let Some(f) = &body.files {
            check_files("files", f, MAX_RUN_BYTES)?;
        }
        // Waits for a Run in flight (on any control process), so the
        // capture never sees half of one's file writes.
        let guard = self.hold_session(session_id, true).await?;
        let (r, mut s) = self.session(round_id, session_id).await?;
        if s.state == SessionState::Ready {
            s.state = self.join(&s).await?;
        }
        if !s.state.can_submit() {
            return Err(refusal(s.state, "submit"));
        }
        let sub_id = new_id("sub");
        // With a live room, what is written and captured is the room's
        // document, whatever the client posted.
        let mut body = body;
        if let Some(doc) = self.room_capture(&s, "submit", &sub_id).await? {
            check_files("the room's files", &doc, MAX_RUN_BYTES)?;
            body.files = Some(doc);
        }
        let sbx = s.sandbox_id.clone().unwrap_or_default();
        for (p, text) in body.files.iter().flatten() {
            self.sandboxes
                .write_file(&sbx, &format!("{WORKDIR}/{p}"), text.as_bytes().to_vec())
                .await?;
        }
        let files = self.read_workdir(&sbx).await?;
        let sub = SubmissionRecord {
            id: sub_id,
            session_id: s.id.clone(),
            round_id: r.id.clone(),
            sha256: files_sha256(&files),
            files: serde_json::to_string(&files)
                .map_err(|e| RoundsError::Internal(e.to_string()))?,
            created_at_ms: now_ms(),
        };
        if !self
            .store
            .begin_submission(&sub, &SessionState::sources(SessionState::Submitted))
            .await?
        {
            let now = self
                .store
                .get_session(&s.id)
                .await?
                .map_or(SessionState::Ended, |x| x.state);
            return Err(refusal(now, "submit"));
        }
        drop(guard);
        if let Some(dropped) = crate::ratelimit::CANDIDATE_EVENTS.allow() {
            tracing::info!(dropped, session = %s.id, submission = %sub.id, sha256 = %sub.sha256, files = files.len(), "submission captured");
        }
        let me = self.clone();
        let (sub2, s2) = (sub.clone(), s.clone());
        tokio::spawn(async move {
            let g = me.grade(&r, &s2, &sub2).await;
            match me.store.finish_grading(&g, &s2.id).await {
                Ok(true) => {}
                Ok(false) => already_graded(&sub2.id, &g.id),
                Err(e) => {
                    tracing::error!(submission = %sub2.id, error = %e, "rounds: storing a grading failed");
                }
            }
        });
        Ok(SubmitAccepted {
            submission_id: sub.id,
            sha256: sub.sha256,
            state: SessionState::Submitted,
        })
    }

    /// After a restart: a session left in `submitted` had its grading cut
    /// off with the old process. Its captured submission is graded now
    /// (the capture is stored, so nothing of the candidate's is needed).
    pub async fn resume_gradings(self: &Arc<Self>) -> Result<usize, RoundsError> {
        // Graders, fresh Runs and preparing sandboxes are never handed
        // over: any left from this process's previous run is an orphan.
        // Another process's (on a shared database) are its own business.
        for kind in ["round-grader", "round-run", "round-prepare"] {
            let ids = self
                .sandboxes
                .list(self.own_meta(&[("kind", kind)]))
                .await?;
            for id in ids {
                tracing::info!(sandbox = %id, kind, "rounds: deleting a sandbox orphaned by a restart");
                let _ = self.sandboxes.delete(&id).await;
            }
        }
        let mut n = 0;
        for s in self
            .store
            .sessions_in_state(SessionState::Submitted)
            .await?
        {
            let Some(sub) = self.store.list_submissions(&s.id).await?.pop() else {
                continue;
            };
            if !self.store.list_gradings(&sub.id).await?.is_empty() {
                continue;
            }
            let r = self.round(&s.round_id).await?;
            let me = self.clone();
            tokio::spawn(async move {
                let g = me.grade(&r, &s, &sub).await;
                match me.store.finish_grading(&g, &s.id).await {
                    Ok(true) => {}
                    Ok(false) => already_graded(&sub.id, &g.id),
                    Err(e) => {
                        tracing::error!(submission = %sub.id, error = %e, "rounds: storing a resumed grading failed");
                    }
                }
            });
            n += 1;
        }
        Ok(n)
    }

    /// One grading of a submission in a fresh grader. Never fails: a
    /// grader that could not run is a grading with status `error`.
    pub(crate) async fn grade(
        &self,
        r: &RoundRecord,
        s: &SessionRecord,
        sub: &SubmissionRecord,
    ) -> GradingRecord {
        let id = new_id("grd");
        let started = std::time::Instant::now();
        let report = match self.grade_in_grader(&id, r, s, sub).await {
            Ok(rep) => rep,
            Err(e) => {
                if let Some(dropped) = crate::ratelimit::CANDIDATE_EVENTS.allow() {
                    tracing::warn!(dropped, submission = %sub.id, error = %e, "rounds: grading failed");
                }
                GradingReport {
                    grading_id: id.clone(),
                    status: "error".into(),
                    passed: 0,
                    total: 0,
                    cases: vec![],
                    stdout: String::new(),
                    stderr: String::new(),
                    exit_code: -1,
                    cpu_ms: 0,
                    wall_ms: started.elapsed().as_millis() as u64,
                    reason: String::new(),
                    error: Some(e.to_string()),
                    graded_at: rfc3339(now_ms()),
                }
            }
        };
        self.metrics
            .gradings
            .with_label_values(&[report.status.as_str()])
            .inc();
        GradingRecord {
            id,
            submission_id: sub.id.clone(),
            created_at_ms: now_ms(),
            status: report.status.clone(),
            passed: report.passed,
            total: report.total,
            report: serde_json::to_string(&report).unwrap_or_default(),
        }
    }

    async fn grade_in_grader(
        &self,
        id: &str,
        r: &RoundRecord,
        s: &SessionRecord,
        sub: &SubmissionRecord,
    ) -> Result<GradingReport, RoundsError> {
        let spec = spec_of(r)?;
        let suite: TestSuite = serde_json::from_str(&r.tests)
            .map_err(|e| RoundsError::Internal(format!("stored suite: {e}")))?;
        let files: BTreeMap<String, String> = serde_json::from_str(&sub.files)
            .map_err(|e| RoundsError::Internal(format!("stored submission: {e}")))?;
        let wall_s = spec.wall_time_limit_ms.div_ceil(1000);
        let timeout = (60 + wall_s * 32).min(3600);
        let snap = r.prepared_snapshot.clone().unwrap_or_default();
        let grader = self
            .sandboxes
            .fork(
                &snap,
                timeout + 120,
                crate::tenant_meta::of_tenant(
                    self.own_meta(&[
                        ("round", &r.id),
                        ("session", &s.id),
                        ("submission", &sub.id),
                        ("kind", "round-grader"),
                    ]),
                    r.tenant.as_deref(),
                ),
            )
            .await
            .map_err(|e| fork_error(r, e))?;
        let res = self
            .grade_on(&grader, id, &spec, &suite, &files, timeout)
            .await;
        // Always destroyed, whatever happened.
        if let Err(e) = self.sandboxes.delete(&grader).await {
            if let Some(dropped) = crate::ratelimit::CANDIDATE_EVENTS.allow() {
                tracing::warn!(dropped, sandbox = %grader, error = %e, "rounds: deleting a grader failed");
            }
        }
        res
    }

    async fn grade_on(
        &self,
        grader: &str,
        id: &str,
        spec: &RoundSpec,
        suite: &TestSuite,
        files: &BTreeMap<String, String>,
        timeout: u64,
    ) -> Result<GradingReport, RoundsError> {
        // The prepared snapshot's /work holds the starter files; the
        // submission replaces them (a starter file the candidate deleted
        // is deleted here too).
        let clean = ExecSpec {
            argv: vec![
                "/bin/sh".into(),
                "-c".into(),
                // The report's directory is root's alone: the built-in
                // runner runs the candidate's code as another uid.
                format!(
                    "rm -rf {WORKDIR} && mkdir -p {WORKDIR} {GRADER_DIR}/tests \
                     && chmod 755 {GRADER_DIR} && mkdir -p -m 700 {GRADER_DIR}/out"
                ),
            ],
            cwd: "/".into(),
            env: BTreeMap::new(),
            timeout_seconds: 30,
            cpu_limit_ms: None,
            cpu_on_host: false,
            max_output_bytes: 64 << 10,
        };
        self.sandboxes.exec(grader, clean).await?;
        for (p, text) in files {
            self.sandboxes
                .write_file(grader, &format!("{WORKDIR}/{p}"), text.as_bytes().to_vec())
                .await?;
        }
        for (p, text) in &suite.files {
            self.sandboxes
                .write_file(
                    grader,
                    &format!("{GRADER_DIR}/tests/{p}"),
                    text.as_bytes().to_vec(),
                )
                .await?;
        }
        let report_path = format!("{GRADER_DIR}/out/report.json");
        let mut env = BTreeMap::new();
        env.insert("HATCHERY_TESTS_DIR".into(), format!("{GRADER_DIR}/tests"));
        env.insert("HATCHERY_REPORT".into(), report_path.clone());
        env.insert(
            "HATCHERY_CPU_LIMIT_MS".into(),
            spec.cpu_time_limit_ms.to_string(),
        );
        let argv = match &suite.runner {
            Some(a) => a.clone(),
            None => {
                let runner = format!("{GRADER_DIR}/run_tests.py");
                self.sandboxes
                    .write_file(grader, &runner, RUNNER.as_bytes().to_vec())
                    .await?;
                vec![
                    "python3".into(),
                    runner,
                    "--tests".into(),
                    format!("{GRADER_DIR}/tests"),
                    "--out".into(),
                    report_path.clone(),
                    "--cpu-limit-ms".into(),
                    spec.cpu_time_limit_ms.to_string(),
                ]
            }
        };
        let o = self
            .sandboxes
            .exec(
                grader,
                ExecSpec {
                    argv,
                    cwd: WORKDIR.into(),
                    env,
                    timeout_seconds: timeout,
                    cpu_limit_ms: None,
                    cpu_on_host: false,
                    max_output_bytes: spec.output_limit_bytes,
                },
            )
            .await?;
        let mut rep = GradingReport {
            grading_id: id.to_string(),
            status: "graded".into(),
            passed: 0,
            total: 0,
            cases: vec![],
            stdout: crate::verdict::tail(&o.stdout, STDOUT_TAIL),
            stderr: crate::verdict::tail(&o.stderr, STDERR_TAIL),
            exit_code: o.exit_code,
            cpu_ms: o.cpu_ms,
            wall_ms: o.duration_ms,
            reason: o.reason.clone(),
            error: None,
            graded_at: rfc3339(now_ms()),
        };
        let parsed = match self.sandboxes.read_file(grader, &report_path).await {
            Ok(raw) => parse_report(&raw),
            Err(e) => Err(format!(
                "the runner wrote no report ({}, exit {}): {e}",
                o.reason, o.exit_code
            )),
        };
        match parsed {
            Ok(cases) => {
                rep.passed = cases.iter().filter(|c| c.ok).count() as u32;
                rep.total = cases.len() as u32;
                rep.cases = cases;
            }
            Err(e) => {
                rep.status = "error".into();
                rep.error = Some(e);
            }
        }
        Ok(rep)
    }

    /// Grades a stored submission again (an appeal): the same captured
    /// files, a new grader. The first grading stays what the candidate
    /// sees; this one is added to the report.
    pub async fn regrade(
        &self,
        round_id: &str,
        session_id: &str,
        submission_id: &str,
    ) -> Result<GradingReport, RoundsError> {
        let (r, s) = self.session(round_id, session_id).await?;
        let sub = self.submission(&s, submission_id).await?;
        // While a submission's first grading runs the session is
        // `submitted`, and only that grading moves it on: a regrade stored
        // first would make finish_grading drop the first one and leave the
        // session `submitted` (no Run, no Submit) until it expired.
        if s.state == SessionState::Submitted && self.store.list_gradings(&sub.id).await?.is_empty()
        {
            return Err(RoundsError::state(
                "grading_in_progress",
                "this submission's first grading is still running; regrade it once it is graded",
            ));
        }
        let g = self.grade(&r, &s, &sub).await;
        self.store.insert_grading(&g).await?;
        serde_json::from_str(&g.report).map_err(|e| RoundsError::Internal(e.to_string()))
    }

    pub(crate) async fn submission(
        &self,
        s: &SessionRecord,
        submission_id: &str,
    ) -> Result<SubmissionRecord, RoundsError> {
        if !valid_id("sub", submission_id) {
            return Err(RoundsError::NotFound(format!("submission {submission_id}")));
        }
        match self.store.get_submission(submission_id).await? {
            Some(x) if x.session_id == s.id => Ok(x),
            _ => Err(RoundsError::NotFound(format!("submission {submission_id}"))),
        }
    }

    pub async fn submission_files(
        &self,
        round_id: &str,
        session_id: &str,
        submission_id: &str,
    ) -> Result<SubmissionFiles, RoundsError> {
        let (_, s) = self.session(round_id, session_id).await?;
        let sub = self.submission(&s, submission_id).await?;
        Ok(SubmissionFiles {
            submission_id: sub.id,
            sha256: sub.sha256,
            files: serde_json::from_str(&sub.files)
                .map_err(|e| RoundsError::Internal(e.to_string()))?,
        })
    }

    /// The reviewer's full report: every submission, every grading.
    pub async fn report(&self, round_id: &str, session_id: &str) -> Result<Report, RoundsError> {
        let (_, s) = self.session(round_id, session_id).await?;
        let mut submissions = vec![];
        for sub in self.store.list_submissions(&s.id).await? {
            let files: BTreeMap<String, String> = serde_json::from_str(&sub.files)
                .map_err(|e| RoundsError::Internal(e.to_string()))?;
            let mut gradings = vec![];
            for g in self.store.list_gradings(&sub.id).await? {
                gradings.push(
                    serde_json::from_str(&g.report)
                        .map_err(|e| RoundsError::Internal(e.to_string()))?,
                );
            }
            submissions.push(SubmissionReport {
                submission_id: sub.id,
                sha256: sub.sha256,
                submitted_at: rfc3339(sub.created_at_ms),
                files: files
                    .iter()
                    .map(|(p, c)| (p.clone(), hex(&Sha256::digest(c.as_bytes()))))
                    .collect(),
                gradings,
            });
        }
        Ok(Report {
            session_id: s.id,
            candidate: s.candidate,
            state: s.state,
            submissions,
        })
    }
}

/// Two processes graded one submission (on a shared database a restarted
/// daemon resumes a grading that another one is still running): the first
/// stored is the grading; a later one is dropped.
fn already_graded(submission: &str, grading: &str) {
    tracing::info!(
        submission,
        grading,
        "rounds: a grading of this submission was already stored; this one is dropped"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_are_recounted_and_bounded() {
        let raw = br#"{"passed": 99, "total": 99, "cases": [
            {"name": "a", "ok": true, "detail": ""}, {"name": "b", "ok": false, "detail": "boom"}]}"#;
        let cases = parse_report(raw).unwrap();
        assert_eq!(cases.iter().filter(|c| c.ok).count(), 1);
        assert_eq!(cases.len(), 2);
        assert!(parse_report(b"not json").is_err());
        assert!(RUNNER.contains("def main"));
    }
}
