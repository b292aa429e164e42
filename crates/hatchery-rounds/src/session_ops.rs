//! Candidate sessions: a persistent sandbox forked from the round's
//! prepared snapshot (deny-all egress, TTL = session length plus slack),
//! the candidate's token, and the session's lifecycle up to its end.

use crate::ids::{new_id, now_ms, rfc3339, valid_id};
use crate::limits::*;
use crate::models::*;
use crate::round_ops::spec_of;
use crate::sandbox::SandboxError;
use crate::state::{refusal, SessionState};
use crate::store::{RoundRecord, Scope, SessionRecord};
use crate::{Rounds, RoundsError};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// A fork of the prepared snapshot failed because what it needs is gone:
/// the snapshot (deleted) or the rootfs it was taken on.
pub(crate) fn fork_error(r: &RoundRecord, e: SandboxError) -> RoundsError {
    match e.code() {
        "snapshot_not_found" | "template_not_found" | "conflict" | "snapshot_corrupt" => {
            RoundsError::TemplateVersionGone {
                template: r.template.clone(),
                version: r.template_version.clone(),
                why: format!("the round's prepared snapshot cannot be forked: {e}"),
            }
        }
        _ => e.into(),
    }
}

pub(crate) fn meta(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (format!("hatchery.{k}"), v.to_string()))
        .collect()
}

/// SHA-256 over the files in path order, each path and content
/// length-prefixed, so no two different file sets hash the same.
pub fn files_sha256(files: &BTreeMap<String, String>) -> String {
    let mut h = Sha256::new();
    for (p, c) in files {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p.as_bytes());
        h.update((c.len() as u64).to_le_bytes());
        h.update(c.as_bytes());
    }
    hex(&h.finalize())
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl Rounds {
    pub async fn create_session(
        &self,
        round_id: &str,
        body: CreateSession,
        host: Option<&str>,
    ) -> Result<SessionCreated, RoundsError> {
        let candidate = body.candidate.trim().to_string();
        if candidate.is_empty() || candidate.len() > MAX_CANDIDATE_BYTES {
            return Err(RoundsError::Invalid(format!(
                "candidate must be 1..{MAX_CANDIDATE_BYTES} bytes"
            )));
        }
        let r = self.round(round_id).await?;
        if !r.state.can_invite() {
            return Err(RoundsError::state(
                "round_not_ready",
                format!("round {round_id} is {}: no new sessions", r.state.as_str()),
            ));
        }
        let spec = spec_of(&r)?;
        let snap = r
            .prepared_snapshot
            .clone()
            .ok_or_else(|| RoundsError::Internal("ready round without a snapshot".into()))?;
        let id = new_id("ses");
        let ttl = spec.session_seconds + SESSION_SLACK_S;
        let sbx = self
            .sandboxes
            .fork(
                &snap,
                ttl,
                crate::tenant_meta::of_tenant(
                    meta(&[
                        ("round", round_id),
                        ("session", &id),
                        ("kind", "round-session"),
                    ]),
                    r.tenant.as_deref(),
                ),
            )
            .await
            .map_err(|e| fork_error(&r, e))?;
        let now = now_ms();
        let token = crate::tokens::mint();
        let rec = SessionRecord {
            id: id.clone(),
            round_id: round_id.to_string(),
            candidate,
            state: SessionState::Ready,
            sandbox_id: Some(sbx.clone()),
            created_at_ms: now,
            expires_at_ms: now + spec.session_seconds * 1000,
            error: None,
        };
        let trec = crate::tokens::record(&token, Scope::Candidate, round_id, Some(&id), now, ttl);
        if let Err(e) = self.store.insert_session(&rec, &trec).await {
            let _ = self.sandboxes.delete(&sbx).await;
            return Err(e.into());
        }
        self.metrics.sessions.inc();
        tracing::info!(round = %round_id, session = %id, sandbox = %sbx, "candidate session ready");
        let url = format!(
            "{}/rounds/room/?round={round_id}&session={id}#{token}",
            self.base_url(host)
        );
        Ok(SessionCreated {
            session: self.session_view(&rec, &r).await?,
            token,
            url,
        })
    }

    /// The session, checked to belong to the round.
    pub async fn session(
        &self,
        round_id: &str,
        session_id: &str,
    ) -> Result<(RoundRecord, SessionRecord), RoundsError> {
        if !valid_id("ses", session_id) {
            return Err(RoundsError::NotFound(format!("session {session_id}")));
        }
        let r = self.round(round_id).await?;
        match self.store.get_session(session_id).await? {
            Some(s) if s.round_id == round_id => Ok((r, s)),
            _ => Err(RoundsError::NotFound(format!("session {session_id}"))),
        }
    }

    pub(crate) async fn session_view(
        &self,
        s: &SessionRecord,
        r: &RoundRecord,
    ) -> Result<Session, RoundsError> {
        let spec = spec_of(r)?;
        Ok(Session {
            id: s.id.clone(),
            round_id: s.round_id.clone(),
            candidate: s.candidate.clone(),
            state: s.state,
            created_at: rfc3339(s.created_at_ms),
            expires_at: rfc3339(s.expires_at_ms),
            result: self.candidate_result(&s.id).await?,
            files: spec.starter_files.keys().cloned().collect(),
            run: spec.run,
            run_mode: spec.run_mode,
            cpu_time_limit_ms: spec.cpu_time_limit_ms,
            wall_time_limit_ms: spec.wall_time_limit_ms,
            round_name: r.name.clone(),
            error: s.error.clone(),
        })
    }

    /// Counts and failed case names of the latest graded submission:
    /// built from the stored numbers and names only, never the report.
    pub(crate) async fn candidate_result(
        &self,
        session_id: &str,
    ) -> Result<Option<CandidateResult>, RoundsError> {
        let subs = self.store.list_submissions(session_id).await?;
        for sub in subs.iter().rev() {
            let gs = self.store.list_gradings(&sub.id).await?;
            if let Some(g) = gs.first() {
                let report: GradingReport = serde_json::from_str(&g.report)
                    .map_err(|e| RoundsError::Internal(format!("report: {e}")))?;
                return Ok(Some(CandidateResult {
                    submission_id: sub.id.clone(),
                    passed: g.passed,
                    total: g.total,
                    failed_cases: report
                        .cases
                        .iter()
                        .filter(|c| !c.ok)
                        .map(|c| c.name.clone())
                        .collect(),
                    status: g.status.clone(),
                }));
            }
        }
        Ok(None)
    }

    /// The candidate opened the room: ready → live (once).
    pub async fn join(&self, s: &SessionRecord) -> Result<SessionState, RoundsError> {
        if s.state == SessionState::Ready
            && self
                .store
                .set_session_state(
                    &s.id,
                    &[SessionState::Ready],
                    SessionState::Live,
                    None,
                    None,
                )
                .await?
        {
            return Ok(SessionState::Live);
        }
        Ok(s.state)
    }

    pub async fn list_sessions(&self, round_id: &str) -> Result<Vec<Session>, RoundsError> {
        let r = self.round(round_id).await?;
        let mut out = vec![];
        for s in self.store.list_sessions(round_id).await? {
            out.push(self.session_view(&s, &r).await?);
        }
        Ok(out)
    }

    /// Everything under the work dir, as text: what Submit captures and
    /// what the room loads. Bounded in count, depth and bytes (413).
    pub(crate) async fn read_workdir(
        &self,
        sbx: &str,
    ) -> Result<BTreeMap<String, String>, RoundsError> {
        let mut out = BTreeMap::new();
        let mut total = 0usize;
        let mut dirs = vec![(WORKDIR.to_string(), 0usize)];
        while let Some((dir, depth)) = dirs.pop() {
            for e in self.sandboxes.list_dir(sbx, &dir).await? {
                let rel = e
                    .path
                    .strip_prefix(&format!("{WORKDIR}/"))
                    .unwrap_or(&e.path)
                    .to_string();
                let base = rel.rsplit('/').next().unwrap_or("");
                if base == "__pycache__" {
                    continue;
                }
                if e.is_dir {
                    if depth + 1 < MAX_PATH_DEPTH {
                        dirs.push((e.path.clone(), depth + 1));
                    }
                    continue;
                }
                if out.len() >= MAX_FILES || total + e.size as usize > MAX_RUN_BYTES {
                    return Err(RoundsError::TooLarge(format!(
                        "{WORKDIR} holds more than {MAX_FILES} files or {MAX_RUN_BYTES} bytes"
                    )));
                }
                let data = self.sandboxes.read_file(sbx, &e.path).await?;
                total += data.len();
                out.insert(rel, String::from_utf8_lossy(&data).into_owned());
            }
        }
        Ok(out)
    }

    pub async fn candidate_files(
        &self,
        s: &SessionRecord,
    ) -> Result<BTreeMap<String, String>, RoundsError> {
        if !s.state.has_sandbox() {
            return Err(refusal(s.state, "read files"));
        }
        let sbx = s.sandbox_id.as_deref().unwrap_or_default();
        self.read_workdir(sbx).await
    }

    pub async fn terminal(&self, s: &SessionRecord) -> Result<TerminalGrant, RoundsError> {
        if !s.state.can_run() {
            return Err(refusal(s.state, "open a terminal"));
        }
        let sbx = s.sandbox_id.clone().unwrap_or_default();
        let (token, expires_at) = self.sandboxes.pty_token(&sbx).await?;
        Ok(TerminalGrant {
            sandbox_id: sbx,
            token,
            expires_at,
        })
    }

    /// Ends a session: a replay snapshot, then the sandbox goes.
    pub async fn end_session(&self, s: &SessionRecord, why: &str) -> Result<(), RoundsError> {
        let _g = self.hold_session(&s.id, true).await?;
        let Some(cur) = self.store.get_session(&s.id).await? else {
            return Err(RoundsError::NotFound(format!("session {}", s.id)));
        };
        if cur.state == SessionState::Ended {
            return Ok(());
        }
        let mut err = None;
        if let Some(sbx) = cur
            .sandbox_id
            .as_deref()
            .filter(|_| cur.state.has_sandbox())
        {
            if let Err(e) = self.take_replay(&cur, "end").await {
                tracing::warn!(session = %cur.id, error = %e, "rounds: replay at end failed");
                err = Some(format!("replay at end failed: {e}"));
            }
            if let Err(e) = self.sandboxes.delete(sbx).await {
                tracing::warn!(session = %cur.id, error = %e, "rounds: deleting the session sandbox failed");
            }
        }
        self.store
            .set_session_state(
                &cur.id,
                &SessionState::sources(SessionState::Ended),
                SessionState::Ended,
                None,
                err.as_deref(),
            )
            .await?;
        // The room closes with the sandbox; its log stays for playback.
        if let Some(room) = self.rooms.live(&cur.id) {
            room.close();
        }
        tracing::info!(session = %cur.id, why, "candidate session ended");
        Ok(())
    }
}
