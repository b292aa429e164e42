//! Run: write the candidate's current files, run the round's command under
//! the layered deadlines (the CPU limit inside the guest, the wall deadline
//! from the host, the sandbox TTL outside both), and give a verdict.
//! One Run per session at a time; none while a grading is in flight.

use crate::ids::{new_id, now_ms, rfc3339};
use crate::limits::*;
use crate::models::*;
use crate::round_ops::spec_of;
use crate::sandbox::{ExecEvent, ExecOutcome, ExecSpec};
use crate::session_ops::fork_error;
use crate::state::refusal;
use crate::store::{RoundRecord, RunRecord, SessionRecord};
use crate::verdict::{tail, verdict, Tail};
use crate::{Rounds, RoundsError};
use futures::stream::BoxStream;
use futures::StreamExt;
use std::collections::BTreeMap;
use std::sync::Arc;

/// What a streamed Run sends.
pub enum RunEvent {
    Stdout(String),
    Stderr(String),
    Result(RunResult),
    Error(RoundsError),
}

/// A Run let in: what it runs and under which id.
struct Admitted {
    r: RoundRecord,
    s: SessionRecord,
    spec: RoundSpec,
    run_id: String,
    files: BTreeMap<String, String>,
}

/// Where a Run happens: the session's own sandbox, or a fresh fork that
/// is deleted afterwards.
struct Target {
    sandbox: String,
    fresh: bool,
}

impl Rounds {
    pub(crate) fn exec_spec(&self, spec: &RoundSpec) -> ExecSpec {
        ExecSpec {
            argv: spec.run.clone(),
            cwd: WORKDIR.into(),
            env: BTreeMap::new(),
            timeout_seconds: spec.wall_time_limit_ms.div_ceil(1000),
            cpu_limit_ms: Some(spec.cpu_time_limit_ms),
            cpu_on_host: true,
            max_output_bytes: spec.output_limit_bytes,
        }
    }

    async fn run_target(
        &self,
        r: &RoundRecord,
        s: &SessionRecord,
        spec: &RoundSpec,
        files: &BTreeMap<String, String>,
    ) -> Result<Target, RoundsError> {
        let target = match spec.run_mode {
            RunMode::Session => Target {
                sandbox: s.sandbox_id.clone().unwrap_or_default(),
                fresh: false,
            },
            RunMode::Fresh => {
                let snap = r.prepared_snapshot.clone().unwrap_or_default();
                let ttl = spec.wall_time_limit_ms.div_ceil(1000) + 120;
                let sbx = self
                    .sandboxes
                    .fork(
                        &snap,
                        ttl,
                        crate::tenant_meta::of_tenant(
                            self.own_meta(&[
                                ("round", &r.id),
                                ("session", &s.id),
                                ("kind", "round-run"),
                            ]),
                            r.tenant.as_deref(),
                        ),
                    )
                    .await
                    .map_err(|e| fork_error(r, e))?;
                Target {
                    sandbox: sbx,
                    fresh: true,
                }
            }
        };
        for (p, text) in files {
            if let Err(e) = self
                .sandboxes
                .write_file(
                    &target.sandbox,
                    &format!("{WORKDIR}/{p}"),
                    text.as_bytes().to_vec(),
                )
                .await
            {
                self.drop_target(&target).await;
                return Err(e.into());
            }
        }
        Ok(target)
    }

    async fn drop_target(&self, t: &Target) {
        if t.fresh {
            if let Err(e) = self.sandboxes.delete(&t.sandbox).await {
                if let Some(dropped) = crate::ratelimit::CANDIDATE_EVENTS.allow() {
                    tracing::warn!(dropped, sandbox = %t.sandbox, error = %e, "rounds: deleting a fresh Run sandbox failed");
                }
            }
        }
    }

    /// Checks before a Run; moves ready → live (the candidate is here).
    /// With a live room the files are the room's document (a marker in
    /// its log names the Run), not `body.files`.
    async fn admit_run(
        &self,
        round_id: &str,
        session_id: &str,
        body: RunBody,
    ) -> Result<Admitted, RoundsError> {
        check_files("files", &body.files, MAX_RUN_BYTES)?;
        let (r, mut s) = self.session(round_id, session_id).await?;
        if !s.state.can_run() {
            return Err(refusal(s.state, "run"));
        }
        s.state = self.join(&s).await?;
        let spec = spec_of(&r)?;
        let run_id = new_id("run");
        let files = match self.room_capture(&s, "run", &run_id).await? {
            Some(doc) => {
                check_files("the room's files", &doc, MAX_RUN_BYTES)?;
                doc
            }
            None => body.files,
        };
        Ok(Admitted {
            r,
            s,
            spec,
            run_id,
            files,
        })
    }

    fn result(
        &self,
        spec: &RoundSpec,
        o: &ExecOutcome,
        stdout: String,
        stderr: String,
        run_id: String,
    ) -> RunResult {
        let v = verdict(o, spec.memory_limit_mb << 20);
        self.metrics
            .runs
            .with_label_values(&[verdict_name(v)])
            .inc();
        RunResult {
            run_id,
            stdout: tail(&stdout, STDOUT_TAIL),
            stderr: tail(&stderr, STDERR_TAIL),
            exit_code: o.exit_code,
            cpu_ms: o.cpu_ms,
            wall_ms: o.duration_ms,
            memory_peak_bytes: o.memory_peak_bytes,
            verdict: v,
            reason: o.reason.clone(),
            truncated: o.truncated,
            created_at: rfc3339(now_ms()),
        }
    }

    /// Tells the session's live room (if any) about a Run: everyone in it
    /// sees the output as it streams.
    fn room_event(&self, session_id: &str, run_id: &str, event: &str, data: serde_json::Value) {
        if let Some(room) = self.rooms.live(session_id) {
            room.event(&serde_json::json!({"event": event, "run_id": run_id, "data": data}));
        }
    }

    async fn record_run(&self, session_id: &str, res: &RunResult) {
        let rec = RunRecord {
            id: res.run_id.clone(),
            session_id: session_id.to_string(),
            created_at_ms: now_ms(),
            result: serde_json::to_string(res).unwrap_or_default(),
        };
        if let Err(e) = self.store.insert_run(&rec, RUNS_KEPT).await {
            if let Some(dropped) = crate::ratelimit::CANDIDATE_EVENTS.allow() {
                tracing::warn!(dropped, session = %session_id, error = %e, "rounds: recording a run failed");
            }
        }
    }

    pub async fn run(
        &self,
        round_id: &str,
        session_id: &str,
        body: RunBody,
    ) -> Result<RunResult, RoundsError> {
        let _g = self.hold_session(session_id, false).await?;
        let a = self.admit_run(round_id, session_id, body).await?;
        let (r, s, spec) = (a.r, a.s, a.spec);
        let t = self.run_target(&r, &s, &spec, &a.files).await?;
        self.room_event(
            session_id,
            &a.run_id,
            "run_started",
            serde_json::Value::Null,
        );
        let out = self.sandboxes.exec(&t.sandbox, self.exec_spec(&spec)).await;
        self.drop_target(&t).await;
        let o = out?;
        let res = self.result(&spec, &o, o.stdout.clone(), o.stderr.clone(), a.run_id);
        self.record_run(session_id, &res).await;
        self.room_event(
            session_id,
            &res.run_id,
            "run_result",
            serde_json::json!(res),
        );
        Ok(res)
    }

    /// The same Run, streamed. Checks happen before the stream starts, so
    /// a refused Run is a plain 4xx.
    pub async fn run_stream(
        self: &Arc<Self>,
        round_id: &str,
        session_id: &str,
        body: RunBody,
    ) -> Result<BoxStream<'static, RunEvent>, RoundsError> {
        let guard = self.hold_session(session_id, false).await?;
        let a = self.admit_run(round_id, session_id, body).await?;
        let (r, s, spec, run_id) = (a.r, a.s, a.spec, a.run_id);
        let t = self.run_target(&r, &s, &spec, &a.files).await?;
        let events = match self
            .sandboxes
            .exec_stream(&t.sandbox, self.exec_spec(&spec))
            .await
        {
            Ok(ev) => ev,
            Err(e) => {
                self.drop_target(&t).await;
                return Err(e.into());
            }
        };
        let me = self.clone();
        let sid = session_id.to_string();
        self.room_event(&sid, &run_id, "run_started", serde_json::Value::Null);
        let (tx, rx) = tokio::sync::mpsc::channel::<RunEvent>(64);
        // The Run goes on in its own task: the result is recorded even if
        // the browser goes away (dropping the events would kill it, so
        // the task keeps them until the exit).
        tokio::spawn(async move {
            let _guard = guard;
            let mut events = events;
            let (mut out, mut err) = (Tail::new(STDOUT_TAIL), Tail::new(STDERR_TAIL));
            let mut forwarded = 0usize;
            let mut outcome = None;
            let mut failure = None;
            while let Some(ev) = events.next().await {
                match ev {
                    // Past the live budget only the tails keep the output.
                    Ok(ExecEvent::Stdout(d)) => {
                        out.push(&d);
                        if forwarded < STREAM_FORWARD_BYTES {
                            forwarded += d.len();
                            me.room_event(&sid, &run_id, "stdout", d.clone().into());
                            let _ = tx.send(RunEvent::Stdout(d)).await;
                        }
                    }
                    Ok(ExecEvent::Stderr(d)) => {
                        err.push(&d);
                        if forwarded < STREAM_FORWARD_BYTES {
                            forwarded += d.len();
                            me.room_event(&sid, &run_id, "stderr", d.clone().into());
                            let _ = tx.send(RunEvent::Stderr(d)).await;
                        }
                    }
                    Ok(ExecEvent::Exit(o)) => {
                        outcome = Some(o);
                        break;
                    }
                    Err(e) => {
                        failure = Some(e);
                        break;
                    }
                }
            }
            drop(events);
            me.drop_target(&t).await;
            match (outcome, failure) {
                (Some(o), _) => {
                    let res = me.result(&spec, &o, out.finish(), err.finish(), run_id.clone());
                    me.record_run(&sid, &res).await;
                    me.room_event(&sid, &run_id, "run_result", serde_json::json!(res));
                    let _ = tx.send(RunEvent::Result(res)).await;
                }
                (None, Some(e)) => {
                    let _ = tx.send(RunEvent::Error(e.into())).await;
                }
                (None, None) => {
                    let _ = tx
                        .send(RunEvent::Error(RoundsError::Internal(
                            "the exec stream ended without an exit".into(),
                        )))
                        .await;
                }
            }
        });
        Ok(tokio_stream::wrappers::ReceiverStream::new(rx).boxed())
    }

    pub async fn list_runs(&self, session_id: &str) -> Result<Vec<RunResult>, RoundsError> {
        self.store
            .list_runs(session_id)
            .await?
            .iter()
            .map(|r| {
                serde_json::from_str(&r.result)
                    .map_err(|e| RoundsError::Internal(format!("run record: {e}")))
            })
            .collect()
    }
}

pub fn verdict_name(v: Verdict) -> &'static str {
    match v {
        Verdict::Ok => "ok",
        Verdict::RuntimeError => "runtime_error",
        Verdict::TimeLimit => "time_limit",
        Verdict::WallLimit => "wall_limit",
        Verdict::MemoryLimit => "memory_limit",
        Verdict::OutputLimit => "output_limit",
    }
}
