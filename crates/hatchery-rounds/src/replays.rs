//! Replays: a snapshot of a session's whole sandbox (files as left, shell
//! history, installed packages), taken at the end and on demand, kept for
//! the round's retention window and deleted by the reaper when it closes.
//! A reviewer's fork of a replay always has deny-all egress and belongs to
//! that reviewer alone.

use crate::ids::{new_id, now_ms, rfc3339, valid_id};
use crate::limits::*;
use crate::models::*;
use crate::round_ops::spec_of;
use crate::sandbox::ExecSpec;
use crate::session_ops::meta;
use crate::state::refusal;
use crate::store::{ForkRecord, ReplayRecord, SessionRecord};
use crate::{Caller, Rounds, RoundsError};
use std::collections::BTreeMap;

pub(crate) fn replay_view(r: &ReplayRecord) -> Replay {
    Replay {
        id: r.id.clone(),
        session_id: r.session_id.clone(),
        round_id: r.round_id.clone(),
        snapshot_id: r.snapshot_id.clone(),
        reason: r.reason.clone(),
        created_at: rfc3339(r.created_at_ms),
        expires_at: rfc3339(r.expires_at_ms),
        state: r.state.clone(),
    }
}

fn fork_view(f: &ForkRecord) -> Fork {
    Fork {
        id: f.id.clone(),
        replay_id: f.replay_id.clone(),
        sandbox_id: f.sandbox_id.clone(),
        created_at: rfc3339(f.created_at_ms),
        expires_at: rfc3339(f.expires_at_ms),
    }
}

impl Rounds {
    pub(crate) async fn take_replay(
        &self,
        s: &SessionRecord,
        reason: &str,
    ) -> Result<ReplayRecord, RoundsError> {
        let r = self.round(&s.round_id).await?;
        let spec = spec_of(&r)?;
        let sbx = s.sandbox_id.as_deref().unwrap_or_default();
        let snap = self
            .sandboxes
            .snapshot(
                sbx,
                spec.retention_seconds,
                meta(&[
                    ("round", &r.id),
                    ("session", &s.id),
                    ("kind", "round-replay"),
                ]),
            )
            .await?;
        let now = now_ms();
        let rec = ReplayRecord {
            id: new_id("rpl"),
            session_id: s.id.clone(),
            round_id: r.id.clone(),
            snapshot_id: snap.clone(),
            reason: reason.to_string(),
            created_at_ms: now,
            expires_at_ms: now + spec.retention_seconds * 1000,
            state: "active".into(),
        };
        if let Err(e) = self.store.insert_replay(&rec).await {
            let _ = self.sandboxes.delete_snapshot(&snap).await;
            return Err(e.into());
        }
        tracing::info!(session = %s.id, replay = %rec.id, snapshot = %snap, reason, "replay taken");
        Ok(rec)
    }

    pub async fn replay_now(
        &self,
        round_id: &str,
        session_id: &str,
    ) -> Result<Replay, RoundsError> {
        let (_, s) = self.session(round_id, session_id).await?;
        let _g = self.hold_session(&s.id, true).await?;
        let s = self.store.get_session(&s.id).await?.unwrap_or(s);
        if !s.state.has_sandbox() {
            return Err(refusal(s.state, "take a replay"));
        }
        Ok(replay_view(&self.take_replay(&s, "on_demand").await?))
    }

    pub async fn list_replays(
        &self,
        round_id: &str,
        session_id: &str,
    ) -> Result<Vec<Replay>, RoundsError> {
        let (_, s) = self.session(round_id, session_id).await?;
        Ok(self
            .store
            .list_replays(&s.id)
            .await?
            .iter()
            .map(replay_view)
            .collect())
    }

    async fn replay(&self, round_id: &str, replay_id: &str) -> Result<ReplayRecord, RoundsError> {
        if !valid_id("rpl", replay_id) {
            return Err(RoundsError::NotFound(format!("replay {replay_id}")));
        }
        match self.store.get_replay(replay_id).await? {
            Some(r) if r.round_id == round_id => Ok(r),
            _ => Err(RoundsError::NotFound(format!("replay {replay_id}"))),
        }
    }

    pub async fn get_replay(&self, round_id: &str, replay_id: &str) -> Result<Replay, RoundsError> {
        Ok(replay_view(&self.replay(round_id, replay_id).await?))
    }

    pub async fn fork_replay(
        &self,
        round_id: &str,
        replay_id: &str,
        caller: &Caller,
    ) -> Result<Fork, RoundsError> {
        let rp = self.replay(round_id, replay_id).await?;
        let tenant = self.round(round_id).await?.tenant;
        if rp.state != "active" {
            return Err(RoundsError::state(
                "replay_expired",
                format!("replay {replay_id} is past its retention window"),
            ));
        }
        if self.store.list_forks(replay_id).await?.len() >= MAX_FORKS_PER_REPLAY {
            return Err(RoundsError::state(
                "too_many_forks",
                format!("replay {replay_id} has {MAX_FORKS_PER_REPLAY} forks; delete one"),
            ));
        }
        let id = new_id("frk");
        // `fork` never takes a policy: every fork is deny-all, the
        // interview's own egress policy.
        let sbx = self
            .sandboxes
            .fork(
                &rp.snapshot_id,
                FORK_TTL_S,
                crate::tenant_meta::of_tenant(
                    meta(&[
                        ("round", round_id),
                        ("replay", replay_id),
                        ("kind", "round-review-fork"),
                    ]),
                    tenant.as_deref(),
                ),
            )
            .await?;
        let now = now_ms();
        let rec = ForkRecord {
            id,
            replay_id: replay_id.to_string(),
            round_id: round_id.to_string(),
            sandbox_id: sbx.clone(),
            owner: caller.owner(),
            created_at_ms: now,
            expires_at_ms: now + FORK_TTL_S * 1000,
        };
        if let Err(e) = self.store.insert_fork(&rec).await {
            let _ = self.sandboxes.delete(&sbx).await;
            return Err(e.into());
        }
        Ok(fork_view(&rec))
    }

    /// A fork the caller made (another reviewer's fork is 404 to them).
    async fn own_fork(
        &self,
        round_id: &str,
        fork_id: &str,
        caller: &Caller,
    ) -> Result<ForkRecord, RoundsError> {
        if !valid_id("frk", fork_id) {
            return Err(RoundsError::NotFound(format!("fork {fork_id}")));
        }
        match self.store.get_fork(fork_id).await? {
            Some(f) if f.round_id == round_id && f.owner == caller.owner() => Ok(f),
            _ => Err(RoundsError::NotFound(format!("fork {fork_id}"))),
        }
    }

    pub async fn fork_files(
        &self,
        round_id: &str,
        fork_id: &str,
        caller: &Caller,
    ) -> Result<FileTree, RoundsError> {
        let f = self.own_fork(round_id, fork_id, caller).await?;
        let files = self.read_workdir(&f.sandbox_id).await?;
        Ok(FileTree {
            files: files.into_keys().collect(),
        })
    }

    pub async fn fork_file(
        &self,
        round_id: &str,
        fork_id: &str,
        path: &str,
        caller: &Caller,
    ) -> Result<FileContent, RoundsError> {
        check_path(path)?;
        let f = self.own_fork(round_id, fork_id, caller).await?;
        let data = self
            .sandboxes
            .read_file(&f.sandbox_id, &format!("{WORKDIR}/{path}"))
            .await
            .map_err(|e| {
                if e.is_not_found() {
                    RoundsError::NotFound(format!("file {path}"))
                } else {
                    e.into()
                }
            })?;
        Ok(FileContent {
            path: path.to_string(),
            content: String::from_utf8_lossy(&data).into_owned(),
        })
    }

    pub async fn fork_exec(
        &self,
        round_id: &str,
        fork_id: &str,
        body: ForkExecBody,
        caller: &Caller,
    ) -> Result<ForkExecResult, RoundsError> {
        let argv = check_argv("argv", &serde_json::json!(body.argv))?;
        let timeout = within(
            "timeout_seconds",
            body.timeout_seconds.unwrap_or(30),
            1,
            300,
        )?;
        let f = self.own_fork(round_id, fork_id, caller).await?;
        let o = self
            .sandboxes
            .exec(
                &f.sandbox_id,
                ExecSpec {
                    argv,
                    cwd: WORKDIR.into(),
                    env: BTreeMap::new(),
                    timeout_seconds: timeout,
                    cpu_limit_ms: None,
                    cpu_on_host: false,
                    max_output_bytes: 1 << 20,
                },
            )
            .await?;
        Ok(ForkExecResult {
            stdout: crate::verdict::tail(&o.stdout, STDOUT_TAIL),
            stderr: crate::verdict::tail(&o.stderr, STDERR_TAIL),
            exit_code: o.exit_code,
            reason: o.reason,
        })
    }

    pub async fn delete_fork(
        &self,
        round_id: &str,
        fork_id: &str,
        caller: &Caller,
    ) -> Result<(), RoundsError> {
        let f = self.own_fork(round_id, fork_id, caller).await?;
        self.sandboxes.delete(&f.sandbox_id).await?;
        self.store.delete_fork(&f.id).await?;
        Ok(())
    }

    /// One pass: replays past their window are deleted; sessions past
    /// their length are ended (which takes their final replay).
    pub async fn reap_once(&self) {
        let now = now_ms();
        match self.store.due_replays(now).await {
            Ok(due) => {
                for rp in due {
                    match self.sandboxes.delete_snapshot(&rp.snapshot_id).await {
                        Ok(()) => {}
                        Err(e) if e.is_not_found() => {}
                        Err(e) => {
                            tracing::warn!(replay = %rp.id, error = %e, "rounds: deleting an expired replay failed; retrying next pass");
                            continue;
                        }
                    }
                    if let Ok(true) = self.store.expire_replay(&rp.id).await {
                        self.metrics.replays_expired.inc();
                        tracing::info!(replay = %rp.id, snapshot = %rp.snapshot_id, "replay expired and deleted");
                    }
                    // The session's final replay: its room's log and notes
                    // share its retention window, and go with it.
                    if rp.reason == "end" {
                        if let Err(e) = self.store.delete_room_data(&rp.session_id).await {
                            tracing::warn!(session = %rp.session_id, error = %e, "rounds: deleting a room's log failed; retrying next pass");
                        }
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "rounds reaper: listing replays failed"),
        }
        match self.store.expired_sessions(now).await {
            Ok(list) => {
                for s in list {
                    if let Err(e) = self.end_session(&s, "expired").await {
                        tracing::warn!(session = %s.id, error = %e, "rounds reaper: ending a session failed");
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "rounds reaper: listing sessions failed"),
        }
    }
}
