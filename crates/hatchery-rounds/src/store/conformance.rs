//! The contract of the rounds store, run on both databases: SQLite in
//! `make unit`, PostgreSQL in `make pg-conformance` (a private server the
//! test starts, or the one `HATCHERY_TEST_PG_DSN` names). Every id
//! carries a per-run suffix and every check looks only at its own rows, so
//! a database may be reused by later runs (and holds other runs' rows).

use super::*;
use crate::state::{RoundState, SessionState};
use hatchery_db::{args, Db};
use std::sync::Arc;

type Store = Arc<dyn RoundStore>;

/// Unique per call: the process id and the clock, so two runs (or two
/// suites in one run) on one database never share an id.
fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("t{}x{nanos:x}", std::process::id())
}

fn round(id: &str, state: RoundState, created_at_ms: u64) -> RoundRecord {
    RoundRecord {
        id: id.into(),
        name: format!("name of {id}"),
        state,
        template: "python".into(),
        template_version: "v3".into(),
        spec: r#"{"language":"python"}"#.into(),
        tests: r#"{"cases":[]}"#.into(),
        prepared_snapshot: None,
        error: None,
        created_at_ms,
    }
}

fn session(id: &str, round_id: &str, state: SessionState, expires_at_ms: u64) -> SessionRecord {
    SessionRecord {
        id: id.into(),
        round_id: round_id.into(),
        candidate: format!("candidate of {id}"),
        state,
        sandbox_id: Some(format!("sbx_{id}")),
        created_at_ms: 1,
        expires_at_ms,
        error: None,
    }
}

fn token(hash: &str, round_id: &str, session_id: Option<&str>) -> TokenRecord {
    TokenRecord {
        hash: hash.into(),
        scope: if session_id.is_some() {
            Scope::Candidate
        } else {
            Scope::Reviewer
        },
        round_id: round_id.into(),
        session_id: session_id.map(Into::into),
        created_at_ms: 1,
        expires_at_ms: 1_000,
    }
}

fn submission(id: &str, ses: &SessionRecord) -> SubmissionRecord {
    SubmissionRecord {
        id: id.into(),
        session_id: ses.id.clone(),
        round_id: ses.round_id.clone(),
        files: r#"{"main.py":"print(1)"}"#.into(),
        sha256: format!("sha_{id}"),
        created_at_ms: 2,
    }
}

fn grading(id: &str, submission_id: &str) -> GradingRecord {
    GradingRecord {
        id: id.into(),
        submission_id: submission_id.into(),
        created_at_ms: 3,
        status: "graded".into(),
        passed: 1,
        total: 2,
        report: format!(r#"{{"grading_id":"{id}"}}"#),
    }
}

/// A ready round, stored.
async fn add_round(s: &Store, id: &str) {
    s.insert_round(&round(id, RoundState::Ready, 1))
        .await
        .unwrap();
}

/// `ses`, stored with its candidate token `h_<id>`.
async fn add_session(s: &Store, ses: &SessionRecord) {
    let t = token(&format!("h_{}", ses.id), &ses.round_id, Some(&ses.id));
    s.insert_session(ses, &t).await.unwrap();
}

/// A round of this run (ready) and a session in it in `state`, with its
/// candidate token.
async fn seed(s: &Store, round_id: &str, ses_id: &str, state: SessionState) -> SessionRecord {
    if s.get_round(round_id).await.unwrap().is_none() {
        add_round(s, round_id).await;
    }
    let ses = session(ses_id, round_id, state, 1_000);
    add_session(s, &ses).await;
    ses
}

/// A unique key or a guard of ours refused the write.
fn conflict<T: std::fmt::Debug>(r: StoreResult<T>) {
    assert!(matches!(r, Err(ref e) if e.conflict()), "{r:?}");
}

/// Moves a session (nothing else set); whether it moved.
async fn move_session(s: &Store, id: &str, from: &[SessionState], to: SessionState) -> bool {
    s.set_session_state(id, from, to, None, None).await.unwrap()
}

/// Moves a round (nothing else set); whether it moved.
async fn move_round(s: &Store, id: &str, from: &[RoundState], to: RoundState) -> bool {
    s.set_round_state(id, from, to, None, None).await.unwrap()
}

async fn session_state(s: &Store, id: &str) -> SessionState {
    s.get_session(id).await.unwrap().unwrap().state
}

/// The ids of the rows this check owns, sorted (the database may hold
/// other runs' rows).
fn mine<T>(rows: Vec<T>, keep: impl Fn(&T) -> bool, id: impl Fn(T) -> String) -> Vec<String> {
    let mut v: Vec<String> = rows.into_iter().filter(keep).map(id).collect();
    v.sort();
    v
}

fn ids<T>(rows: &[T], id: impl Fn(&T) -> &str) -> Vec<String> {
    rows.iter().map(|r| id(r).to_string()).collect()
}

/// Every check, on fresh ids.
pub async fn run_all(s: &Store) {
    let run = run_id();
    rounds_insert_get_list(s, &run).await;
    round_moves_name_their_source_state(s, &run).await;
    session_and_token_are_one_transaction(s, &run).await;
    sessions_by_round_and_state(s, &run).await;
    expired_sessions_are_the_unended_past_expiry(s, &run).await;
    session_moves_name_their_source_state(s, &run).await;
    runs_keep_the_newest(s, &run).await;
    begin_submission_is_guarded(s, &run).await;
    finish_grading_writes_the_first_only(s, &run).await;
    racing_finish_gradings_write_one(std::slice::from_ref(s), &format!("{run}_a")).await;
    regrades_add_rows(s, &run).await;
    replays_fall_due_and_expire_once(s, &run).await;
    forks_insert_get_list_delete(s, &run).await;
    out_of_range_values_are_refused(s, &run).await;
}

async fn rounds_insert_get_list(s: &Store, run: &str) {
    let (a, b) = (format!("rnd_la_{run}"), format!("rnd_lb_{run}"));
    let mut ra = round(&a, RoundState::Preparing, 20);
    ra.error = Some("e".into());
    ra.prepared_snapshot = Some("snp_x".into());
    s.insert_round(&ra).await.unwrap();
    s.insert_round(&round(&b, RoundState::Ready, 10))
        .await
        .unwrap();
    // The same record, field for field, from either backend.
    assert_eq!(s.get_round(&a).await.unwrap(), Some(ra.clone()));
    assert_eq!(s.get_round(&format!("rnd_none_{run}")).await.unwrap(), None);
    // The same id twice: a conflict, the first one kept.
    let mut again = round(&a, RoundState::Ready, 30);
    again.name = "other".into();
    conflict(s.insert_round(&again).await);
    assert_eq!(s.get_round(&a).await.unwrap(), Some(ra));
    // Oldest first (the database may hold other runs' rounds).
    let mine: Vec<String> = s
        .list_rounds()
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.id.ends_with(run))
        .map(|r| r.id)
        .collect();
    assert_eq!(mine, vec![b, a]);
}

const ROUND_STATES: [RoundState; 4] = [
    RoundState::Preparing,
    RoundState::Ready,
    RoundState::Failed,
    RoundState::Archived,
];

async fn round_moves_name_their_source_state(s: &Store, run: &str) {
    let mut n = 0;
    for to in ROUND_STATES {
        let from = RoundState::sources(to);
        for st in ROUND_STATES {
            n += 1;
            let id = format!("rnd_mv{n}_{run}");
            s.insert_round(&round(&id, st, 1)).await.unwrap();
            let moved = s
                .set_round_state(&id, &from, to, Some("snp"), Some("why"))
                .await
                .unwrap();
            let got = s.get_round(&id).await.unwrap().unwrap();
            if from.contains(&st) {
                assert!(moved, "{st:?} -> {to:?}");
                assert_eq!(got.state, to);
                assert_eq!(got.prepared_snapshot.as_deref(), Some("snp"));
                assert_eq!(got.error.as_deref(), Some("why"));
                // A second racer finds it moved.
                assert!(!move_round(s, &id, &from, to).await);
            } else {
                // Refused, final states included: nothing written.
                assert!(!moved, "{st:?} -> {to:?} applied");
                assert_eq!(got, round(&id, st, 1));
            }
        }
    }
    // A final state is never left, whatever the move.
    let id = format!("rnd_final_{run}");
    s.insert_round(&round(&id, RoundState::Archived, 1))
        .await
        .unwrap();
    for to in ROUND_STATES {
        assert!(!move_round(s, &id, &RoundState::sources(to), to).await);
    }
    assert_eq!(
        s.get_round(&id).await.unwrap().unwrap().state,
        RoundState::Archived
    );
    // What is not given is kept.
    let id = format!("rnd_keep_{run}");
    s.insert_round(&round(&id, RoundState::Preparing, 1))
        .await
        .unwrap();
    s.set_round_state(
        &id,
        &[RoundState::Preparing],
        RoundState::Ready,
        Some("snp_k"),
        None,
    )
    .await
    .unwrap();
    move_round(s, &id, &[RoundState::Ready], RoundState::Archived).await;
    let r = s.get_round(&id).await.unwrap().unwrap();
    assert_eq!(
        (r.state, r.prepared_snapshot.as_deref(), r.error),
        (RoundState::Archived, Some("snp_k"), None)
    );
    // Nothing moves an unknown round.
    assert!(
        !move_round(
            s,
            &format!("rnd_none_{run}"),
            &[RoundState::Preparing],
            RoundState::Ready
        )
        .await
    );
}

async fn session_and_token_are_one_transaction(s: &Store, run: &str) {
    let rnd = format!("rnd_st_{run}");
    add_round(s, &rnd).await;
    let sid = format!("ses_st_{run}");
    let ses = session(&sid, &rnd, SessionState::Ready, 100);
    let tok = token(&format!("h1_{run}"), &rnd, Some(&sid));
    s.insert_session(&ses, &tok).await.unwrap();
    assert_eq!(s.get_session(&sid).await.unwrap(), Some(ses.clone()));
    assert_eq!(s.get_token(&tok.hash).await.unwrap(), Some(tok.clone()));
    // A duplicate session id: refused, and its token is not left behind.
    let tok2 = token(&format!("h2_{run}"), &rnd, Some(&sid));
    conflict(s.insert_session(&ses, &tok2).await);
    assert_eq!(s.get_token(&tok2.hash).await.unwrap(), None);
    // A token hash already taken: the session is not left behind.
    let sid3 = format!("ses_st3_{run}");
    assert!(s
        .insert_session(&session(&sid3, &rnd, SessionState::Ready, 100), &tok)
        .await
        .is_err());
    assert_eq!(s.get_session(&sid3).await.unwrap(), None);
    // A session of a round that does not exist is refused.
    let sid4 = format!("ses_st4_{run}");
    assert!(s
        .insert_session(
            &session(&sid4, &format!("rnd_none_{run}"), SessionState::Ready, 100),
            &token(&format!("h4_{run}"), &rnd, Some(&sid4))
        )
        .await
        .is_err());
    assert_eq!(s.get_session(&sid4).await.unwrap(), None);
    assert_eq!(s.get_token(&format!("h4_{run}")).await.unwrap(), None);
    // A reviewer token, on its own.
    let rev = token(&format!("hr_{run}"), &rnd, None);
    s.insert_token(&rev).await.unwrap();
    assert_eq!(s.get_token(&rev.hash).await.unwrap(), Some(rev.clone()));
    conflict(s.insert_token(&rev).await);
    assert_eq!(s.get_token(&format!("h_none_{run}")).await.unwrap(), None);
}

const SESSION_STATES: [SessionState; 6] = [
    SessionState::Preparing,
    SessionState::Ready,
    SessionState::Live,
    SessionState::Submitted,
    SessionState::Graded,
    SessionState::Ended,
];

async fn sessions_by_round_and_state(s: &Store, run: &str) {
    let rnd = format!("rnd_ss_{run}");
    add_round(s, &rnd).await;
    for (n, st) in SESSION_STATES.into_iter().enumerate() {
        let sid = format!("ses_ss{n}_{run}");
        let mut ses = session(&sid, &rnd, st, 100);
        // Newest first in insertion order: the list is by creation time.
        ses.created_at_ms = 100 - n as u64;
        add_session(s, &ses).await;
    }
    let other = format!("rnd_ss_other_{run}");
    seed(s, &other, &format!("ses_ssx_{run}"), SessionState::Live).await;
    let listed = s.list_sessions(&rnd).await.unwrap();
    assert_eq!(
        ids(&listed, |x| &x.id),
        (0..6)
            .rev()
            .map(|n| format!("ses_ss{n}_{run}"))
            .collect::<Vec<_>>()
    );
    assert!(s
        .list_sessions(&format!("rnd_none_{run}"))
        .await
        .unwrap()
        .is_empty());
    for (n, st) in SESSION_STATES.into_iter().enumerate() {
        let all = s.sessions_in_state(st).await.unwrap();
        assert!(all.iter().all(|x| x.state == st));
        let mine: Vec<_> = all.iter().filter(|x| x.round_id == rnd).collect();
        assert_eq!(mine.len(), 1, "{st:?}");
        assert_eq!(mine[0].id, format!("ses_ss{n}_{run}"));
    }
}

async fn expired_sessions_are_the_unended_past_expiry(s: &Store, run: &str) {
    let rnd = format!("rnd_ex_{run}");
    add_round(s, &rnd).await;
    for (name, st, exp) in [
        ("a", SessionState::Live, 100),
        ("b", SessionState::Graded, 200),
        ("c", SessionState::Ended, 50),
        ("d", SessionState::Preparing, 300),
    ] {
        add_session(s, &session(&format!("ses_ex{name}_{run}"), &rnd, st, exp)).await;
    }
    let rnd = &rnd;
    let expired = |now: u64| async move {
        let v = s.expired_sessions(now).await.unwrap();
        mine(v, |x| x.round_id == *rnd, |x| x.id)
    };
    let id = |n: &str| format!("ses_ex{n}_{run}");
    assert!(expired(99).await.is_empty());
    assert_eq!(expired(100).await, vec![id("a")]);
    assert_eq!(expired(299).await, vec![id("a"), id("b")]);
    assert_eq!(expired(u64::MAX).await, vec![id("a"), id("b"), id("d")]);
}

async fn session_moves_name_their_source_state(s: &Store, run: &str) {
    let rnd = format!("rnd_sm_{run}");
    add_round(s, &rnd).await;
    let mut n = 0;
    for to in SESSION_STATES {
        let from = SessionState::sources(to);
        for st in SESSION_STATES {
            n += 1;
            let sid = format!("ses_sm{n}_{run}");
            let mut ses = session(&sid, &rnd, st, 100);
            ses.sandbox_id = None;
            add_session(s, &ses).await;
            let moved = s
                .set_session_state(&sid, &from, to, Some("sbx_new"), Some("why"))
                .await
                .unwrap();
            let got = s.get_session(&sid).await.unwrap().unwrap();
            if from.contains(&st) {
                assert!(moved, "{st:?} -> {to:?}");
                assert_eq!(got.state, to);
                assert_eq!(got.sandbox_id.as_deref(), Some("sbx_new"));
                assert_eq!(got.error.as_deref(), Some("why"));
                assert!(!move_session(s, &sid, &[st], to).await);
            } else {
                assert!(!moved, "{st:?} -> {to:?} applied");
                assert_eq!(got, ses);
            }
        }
    }
    // `ended` is never left; what is not given is kept.
    let sid = format!("ses_smend_{run}");
    let ses = seed(s, &rnd, &sid, SessionState::Live).await;
    assert!(s
        .set_session_state(
            &sid,
            &SessionState::sources(SessionState::Ended),
            SessionState::Ended,
            None,
            Some("expired")
        )
        .await
        .unwrap());
    for to in SESSION_STATES {
        assert!(!move_session(s, &sid, &SessionState::sources(to), to).await);
    }
    let got = s.get_session(&sid).await.unwrap().unwrap();
    assert_eq!(
        (got.state, got.sandbox_id, got.error.as_deref()),
        (SessionState::Ended, ses.sandbox_id, Some("expired"))
    );
    assert!(
        !move_session(
            s,
            &format!("ses_none_{run}"),
            &[SessionState::Live],
            SessionState::Ended
        )
        .await
    );
}

async fn runs_keep_the_newest(s: &Store, run: &str) {
    let (a, b) = (format!("ses_ra_{run}"), format!("ses_rb_{run}"));
    let rec = |ses: &str, i: u64| RunRecord {
        id: format!("run_{i}_{ses}"),
        session_id: ses.into(),
        // Not in order: the newest is the last inserted.
        created_at_ms: 10 - i,
        result: format!(r#"{{"n":{i}}}"#),
    };
    for i in 0..5 {
        s.insert_run(&rec(&a, i), 3).await.unwrap();
    }
    for i in 0..2 {
        s.insert_run(&rec(&b, i), 3).await.unwrap();
    }
    assert_eq!(
        s.list_runs(&a).await.unwrap(),
        (2..5).map(|i| rec(&a, i)).collect::<Vec<_>>()
    );
    assert_eq!(
        s.list_runs(&b).await.unwrap(),
        (0..2).map(|i| rec(&b, i)).collect::<Vec<_>>()
    );
    conflict(s.insert_run(&rec(&b, 1), 3).await);
    assert_eq!(s.list_runs(&b).await.unwrap().len(), 2);
    s.insert_run(&rec(&a, 7), 1).await.unwrap();
    assert_eq!(s.list_runs(&a).await.unwrap(), vec![rec(&a, 7)]);
    assert!(s
        .list_runs(&format!("ses_none_{run}"))
        .await
        .unwrap()
        .is_empty());
}

async fn begin_submission_is_guarded(s: &Store, run: &str) {
    let rnd = format!("rnd_bs_{run}");
    let ses = seed(s, &rnd, &format!("ses_bs_{run}"), SessionState::Live).await;
    let from = SessionState::sources(SessionState::Submitted);
    let sub = submission(&format!("sub_bs1_{run}"), &ses);
    assert!(s.begin_submission(&sub, &from).await.unwrap());
    assert_eq!(session_state(s, &ses.id).await, SessionState::Submitted);
    assert_eq!(s.get_submission(&sub.id).await.unwrap(), Some(sub.clone()));
    // A second submit while one is graded: refused, nothing written.
    let sub2 = submission(&format!("sub_bs2_{run}"), &ses);
    assert!(!s.begin_submission(&sub2, &from).await.unwrap());
    assert_eq!(s.get_submission(&sub2.id).await.unwrap(), None);
    assert_eq!(
        s.list_submissions(&ses.id).await.unwrap(),
        vec![sub.clone()]
    );
    // Graded: may submit again; the list is in submission order.
    assert!(move_session(s, &ses.id, &[SessionState::Submitted], SessionState::Graded).await);
    let mut sub3 = submission(&format!("sub_bs3_{run}"), &ses);
    sub3.created_at_ms = 1;
    assert!(s.begin_submission(&sub3, &from).await.unwrap());
    assert_eq!(
        s.list_submissions(&ses.id).await.unwrap(),
        vec![sub.clone(), sub3]
    );
    // Ended: refused.
    let ended = seed(s, &rnd, &format!("ses_bse_{run}"), SessionState::Ended).await;
    let sub4 = submission(&format!("sub_bs4_{run}"), &ended);
    assert!(!s.begin_submission(&sub4, &from).await.unwrap());
    assert!(s.list_submissions(&ended.id).await.unwrap().is_empty());
    assert_eq!(session_state(s, &ended.id).await, SessionState::Ended);
    // An unknown session: refused.
    let ghost = session(&format!("ses_none_{run}"), &rnd, SessionState::Live, 1);
    assert!(!s
        .begin_submission(&submission(&format!("sub_bs5_{run}"), &ghost), &from)
        .await
        .unwrap());
    assert_eq!(
        s.get_submission(&format!("sub_bs5_{run}")).await.unwrap(),
        None
    );
}

async fn finish_grading_writes_the_first_only(s: &Store, run: &str) {
    let rnd = format!("rnd_fg_{run}");
    let ses = seed(s, &rnd, &format!("ses_fg_{run}"), SessionState::Live).await;
    let from = SessionState::sources(SessionState::Submitted);
    let sub = submission(&format!("sub_fg_{run}"), &ses);
    assert!(s.begin_submission(&sub, &from).await.unwrap());
    let mut g = grading(&format!("grd_fg1_{run}"), &sub.id);
    // The widest counts read back as written.
    g.passed = u32::MAX;
    g.total = u32::MAX;
    assert!(s.finish_grading(&g, &ses.id).await.unwrap());
    assert_eq!(s.list_gradings(&sub.id).await.unwrap(), vec![g.clone()]);
    assert_eq!(session_state(s, &ses.id).await, SessionState::Graded);
    // A later duplicate (another process graded it too): nothing written,
    // and the session (submitted again meanwhile) is not moved.
    let sub2 = submission(&format!("sub_fg2_{run}"), &ses);
    assert!(s.begin_submission(&sub2, &from).await.unwrap());
    let dup = grading(&format!("grd_fg2_{run}"), &sub.id);
    assert!(!s.finish_grading(&dup, &ses.id).await.unwrap());
    assert_eq!(s.list_gradings(&sub.id).await.unwrap(), vec![g]);
    assert_eq!(session_state(s, &ses.id).await, SessionState::Submitted);
    // A session that ended while it was graded keeps `ended`; the grading
    // is stored.
    assert!(move_session(s, &ses.id, &[SessionState::Submitted], SessionState::Ended).await);
    let g2 = grading(&format!("grd_fg3_{run}"), &sub2.id);
    assert!(s.finish_grading(&g2, &ses.id).await.unwrap());
    assert_eq!(s.list_gradings(&sub2.id).await.unwrap(), vec![g2]);
    assert_eq!(session_state(s, &ses.id).await, SessionState::Ended);
    // A submission that is not stored: refused, nothing written.
    let ghost = grading(&format!("grd_fg4_{run}"), &format!("sub_none_{run}"));
    conflict(s.finish_grading(&ghost, &ses.id).await);
    assert!(s
        .list_gradings(&format!("sub_none_{run}"))
        .await
        .unwrap()
        .is_empty());
}

/// 8 first gradings of one submission at once, spread over `stores` (on
/// one database: two processes): exactly one is written.
async fn racing_finish_gradings_write_one(stores: &[Store], run: &str) {
    let s = &stores[0];
    let rnd = format!("rnd_race_{run}");
    let ses = seed(s, &rnd, &format!("ses_race_{run}"), SessionState::Live).await;
    let sub = submission(&format!("sub_race_{run}"), &ses);
    assert!(s
        .begin_submission(&sub, &SessionState::sources(SessionState::Submitted))
        .await
        .unwrap());
    let start = Arc::new(tokio::sync::Barrier::new(8));
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let st = stores[i % stores.len()].clone();
            let (start, g, sid) = (
                start.clone(),
                grading(&format!("grd_race{i}_{run}"), &sub.id),
                ses.id.clone(),
            );
            tokio::spawn(async move {
                start.wait().await;
                (st.finish_grading(&g, &sid).await.unwrap(), g.id)
            })
        })
        .collect();
    let mut won = vec![];
    for t in tasks {
        let (wrote, id) = t.await.unwrap();
        if wrote {
            won.push(id);
        }
    }
    assert_eq!(won.len(), 1, "exactly one of 8 racing gradings is written");
    assert_eq!(
        ids(&s.list_gradings(&sub.id).await.unwrap(), |g| &g.id),
        won
    );
    assert_eq!(session_state(s, &ses.id).await, SessionState::Graded);
}

async fn regrades_add_rows(s: &Store, run: &str) {
    let rnd = format!("rnd_rg_{run}");
    let ses = seed(s, &rnd, &format!("ses_rg_{run}"), SessionState::Live).await;
    let sub = submission(&format!("sub_rg_{run}"), &ses);
    assert!(s
        .begin_submission(&sub, &SessionState::sources(SessionState::Submitted))
        .await
        .unwrap());
    let first = grading(&format!("grd_rg0_{run}"), &sub.id);
    assert!(s.finish_grading(&first, &ses.id).await.unwrap());
    let mut all = vec![first];
    for i in 1..3 {
        let mut g = grading(&format!("grd_rg{i}_{run}"), &sub.id);
        g.status = "error".into();
        g.passed = 0;
        // Listed in insertion order, not by time.
        g.created_at_ms = 10 - i;
        s.insert_grading(&g).await.unwrap();
        all.push(g);
    }
    assert_eq!(s.list_gradings(&sub.id).await.unwrap(), all);
    conflict(s.insert_grading(&all[1]).await);
    assert_eq!(s.list_gradings(&sub.id).await.unwrap().len(), 3);
    assert_eq!(session_state(s, &ses.id).await, SessionState::Graded);
    // A regrade is never a first grading: finish_grading refuses after it.
    let late = grading(&format!("grd_rg9_{run}"), &sub.id);
    assert!(!s.finish_grading(&late, &ses.id).await.unwrap());
    assert_eq!(s.list_gradings(&sub.id).await.unwrap(), all);
}

async fn replays_fall_due_and_expire_once(s: &Store, run: &str) {
    let ses = format!("ses_rp_{run}");
    let rec = |name: &str, created: u64, expires: u64, state: &str| ReplayRecord {
        id: format!("rpl_{name}_{run}"),
        session_id: ses.clone(),
        round_id: format!("rnd_rp_{run}"),
        snapshot_id: format!("snp_{name}"),
        reason: "end".into(),
        created_at_ms: created,
        expires_at_ms: expires,
        state: state.into(),
    };
    let (a, b, c) = (
        rec("a", 3, 10, "active"),
        rec("b", 1, 20, "active"),
        rec("c", 2, 5, "expired"),
    );
    for r in [&a, &b, &c] {
        s.insert_replay(r).await.unwrap();
    }
    assert_eq!(s.get_replay(&a.id).await.unwrap(), Some(a.clone()));
    conflict(s.insert_replay(&a).await);
    assert_eq!(
        s.list_replays(&ses).await.unwrap(),
        vec![b.clone(), c.clone(), a.clone()]
    );
    let ses = &ses;
    let due = |now: u64| async move {
        let v = s.due_replays(now).await.unwrap();
        mine(v, |r| r.session_id == *ses, |r| r.id)
    };
    assert!(due(9).await.is_empty());
    assert_eq!(due(10).await, vec![a.id.clone()]);
    assert_eq!(due(20).await, vec![a.id.clone(), b.id.clone()]);
    assert!(s.expire_replay(&a.id).await.unwrap());
    assert!(!s.expire_replay(&a.id).await.unwrap(), "expired twice");
    assert!(!s.expire_replay(&c.id).await.unwrap());
    assert!(!s.expire_replay(&format!("rpl_none_{run}")).await.unwrap());
    assert_eq!(due(20).await, vec![b.id.clone()]);
    assert_eq!(s.get_replay(&a.id).await.unwrap().unwrap().state, "expired");
    assert_eq!(
        s.get_replay(&format!("rpl_none_{run}")).await.unwrap(),
        None
    );
}

async fn forks_insert_get_list_delete(s: &Store, run: &str) {
    let rpl = format!("rpl_fk_{run}");
    let rec = |n: u64| ForkRecord {
        id: format!("frk_{n}_{run}"),
        replay_id: rpl.clone(),
        round_id: format!("rnd_fk_{run}"),
        sandbox_id: format!("sbx_fk{n}"),
        owner: format!("owner{n}"),
        created_at_ms: 10 - n,
        expires_at_ms: 100,
    };
    let (f1, f2) = (rec(1), rec(2));
    s.insert_fork(&f1).await.unwrap();
    s.insert_fork(&f2).await.unwrap();
    conflict(s.insert_fork(&f1).await);
    assert_eq!(s.get_fork(&f1.id).await.unwrap(), Some(f1.clone()));
    assert_eq!(
        s.list_forks(&rpl).await.unwrap(),
        vec![f2.clone(), f1.clone()]
    );
    assert!(s.delete_fork(&f1.id).await.unwrap());
    assert!(!s.delete_fork(&f1.id).await.unwrap());
    assert_eq!(s.get_fork(&f1.id).await.unwrap(), None);
    assert_eq!(s.list_forks(&rpl).await.unwrap(), vec![f2]);
    assert!(s
        .list_forks(&format!("rpl_none_{run}"))
        .await
        .unwrap()
        .is_empty());
}

async fn out_of_range_values_are_refused(s: &Store, run: &str) {
    // The largest stored value reads back as written.
    let edge = format!("rnd_edge_{run}");
    let r = round(&edge, RoundState::Ready, i64::MAX as u64);
    s.insert_round(&r).await.unwrap();
    assert_eq!(s.get_round(&edge).await.unwrap(), Some(r));
    // One past it is refused, not wrapped (a wrapped expiry would read as
    // long past), and nothing is written.
    let big = i64::MAX as u64 + 1;
    let id = format!("rnd_big_{run}");
    assert!(s
        .insert_round(&round(&id, RoundState::Ready, big))
        .await
        .is_err());
    assert_eq!(s.get_round(&id).await.unwrap(), None);
    let sid = format!("ses_big_{run}");
    let hash = format!("h_big_{run}");
    assert!(s
        .insert_session(
            &session(&sid, &edge, SessionState::Ready, u64::MAX),
            &token(&hash, &edge, Some(&sid))
        )
        .await
        .is_err());
    assert_eq!(s.get_session(&sid).await.unwrap(), None);
    assert_eq!(s.get_token(&hash).await.unwrap(), None);
    let sid = format!("ses_big2_{run}");
    let mut tok = token(&format!("h_big2_{run}"), &edge, Some(&sid));
    tok.expires_at_ms = big;
    assert!(s
        .insert_session(&session(&sid, &edge, SessionState::Ready, 1), &tok)
        .await
        .is_err());
    assert_eq!(s.get_session(&sid).await.unwrap(), None);
    let mut rp = ReplayRecord {
        id: format!("rpl_big_{run}"),
        session_id: sid.clone(),
        round_id: edge.clone(),
        snapshot_id: "snp".into(),
        reason: "end".into(),
        created_at_ms: 1,
        expires_at_ms: big,
        state: "active".into(),
    };
    assert!(s.insert_replay(&rp).await.is_err());
    rp.expires_at_ms = 1;
    s.insert_replay(&rp).await.unwrap();
    let run_rec = RunRecord {
        id: format!("run_big_{run}"),
        session_id: sid.clone(),
        created_at_ms: big,
        result: "{}".into(),
    };
    assert!(s.insert_run(&run_rec, 3).await.is_err());
    assert!(s.list_runs(&sid).await.unwrap().is_empty());
}

/// What one store wrote, another opened later on the same database reads.
async fn reopened_store_keeps_rows(first: &Store, second: &Store) {
    let run = run_id();
    let rnd = format!("rnd_reopen_{run}");
    let ses = seed(
        first,
        &rnd,
        &format!("ses_reopen_{run}"),
        SessionState::Live,
    )
    .await;
    assert_eq!(
        second.get_round(&rnd).await.unwrap(),
        first.get_round(&rnd).await.unwrap()
    );
    assert_eq!(second.get_session(&ses.id).await.unwrap(), Some(ses));
}

/// A stored scope or state that is none of ours reads as `Corrupt`, never
/// as some default: a token whose scope was rewritten must not grant a
/// reviewer's rights, a session in an unknown state must not pass as
/// ended. Both rows are rewritten past the store, on `db` (the trait has
/// no way to store such names), and put right afterwards: a later run on
/// the same database must not meet them.
async fn unknown_names_read_as_corrupt(s: &Store, db: &Db) {
    let run = run_id();
    let ses = seed(
        s,
        &format!("rnd_bad_{run}"),
        &format!("ses_bad_{run}"),
        SessionState::Live,
    )
    .await;
    let hash = format!("h_{}", ses.id);
    assert!(s.get_token(&hash).await.unwrap().is_some());
    let set = |scope: &'static str, state: &'static str| {
        let (hash, sid) = (hash.clone(), ses.id.clone());
        async move {
            db.execute(
                "UPDATE round_tokens SET scope = $2 WHERE hash = $1",
                args![hash, scope],
            )
            .await
            .unwrap();
            db.execute(
                "UPDATE round_sessions SET state = $2 WHERE id = $1",
                args![sid, state],
            )
            .await
            .unwrap();
        }
    };
    set("admin", "paused").await;
    let e = s.get_token(&hash).await.unwrap_err();
    assert!(matches!(e, StoreError::Corrupt(_)), "{e:?}");
    assert!(e.to_string().contains("scope"), "{e}");
    let e = s.get_session(&ses.id).await.unwrap_err();
    assert!(matches!(e, StoreError::Corrupt(_)), "{e:?}");
    assert!(e.to_string().contains("state"), "{e}");
    set("candidate", "ended").await;
    assert_eq!(session_state(s, &ses.id).await, SessionState::Ended);
}

/// Until `cond` holds, for at most 5 s (a released hold is said on its
/// connection by a task of its own, so the next taker may wait a moment).
async fn eventually(what: &str, mut cond: impl AsyncFnMut() -> bool) {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !cond().await {
        assert!(std::time::Instant::now() < end, "not within 5 s: {what}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Two processes on one database (two pools): a session held by one is
/// refused to the other's try and waited for by its wait; released, it
/// goes to the waiter. A waiter whose request is dropped mid-wait leaves
/// nothing held once the holder lets go. Other sessions are not blocked.
async fn session_holds_exclude_other_processes(a: &Store, b: &Store) {
    let run = run_id();
    // Released, a session is free at once for the same process (its next
    // Run), though the release is said by a task of its own.
    let again = format!("ses_hold0_{run}");
    for _ in 0..20 {
        let h = a.lock_session(&again, false).await.unwrap();
        assert!(h.is_some(), "a session this process released is still held");
    }
    let (one, two) = (format!("ses_hold1_{run}"), format!("ses_hold2_{run}"));
    let held = a.lock_session(&one, false).await.unwrap().expect("free");
    assert!(b.lock_session(&one, false).await.unwrap().is_none());
    assert!(b.lock_session(&two, false).await.unwrap().is_some());
    // A waiter, given up after 200 ms (as a request whose client left).
    let gave_up = tokio::time::timeout(
        std::time::Duration::from_millis(200),
        b.lock_session(&one, true),
    )
    .await;
    assert!(gave_up.is_err(), "a held session was granted");
    // A waiter that stays: granted once the holder lets go.
    let waiter = {
        let (b, one) = (b.clone(), one.clone());
        tokio::spawn(async move { b.lock_session(&one, true).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "granted while held");
    drop(held);
    let second = tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
        .await
        .expect("the waiter was not granted within 5 s")
        .unwrap()
        .unwrap()
        .expect("a wait is never refused");
    assert!(a.lock_session(&one, false).await.unwrap().is_none());
    drop(second);
    // The given-up waiter took the lock after `second` let go, or will,
    // and lets go in turn: nothing stays held.
    eventually("the session is free again", async || {
        a.lock_session(&one, false).await.unwrap().is_some()
    })
    .await;
}

async fn open(db: &Db) -> Store {
    Arc::new(DbStore::open(db.clone()).await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_on_sqlite() {
    let scratch = Db::sqlite_memory().unwrap();
    run_all(&open(&scratch).await).await;
    // A file, opened twice (as two processes would): the second open's
    // migrations are a no-op, and the two race for one first grading.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hatchery.db");
    let db = Db::sqlite(&path).await.unwrap();
    let s = open(&db).await;
    run_all(&s).await;
    let db2 = Db::sqlite(&path).await.unwrap();
    let again = open(&db2).await;
    second_process(&s, &again, &db2, &[s.clone(), again.clone()]).await;
    // One process owns the file: its own lock is the only one needed.
    let held = s.lock_session("ses_one", false).await.unwrap();
    assert!(
        held.is_some()
            && again
                .lock_session("ses_one", false)
                .await
                .unwrap()
                .is_some()
    );
}

/// `again`, a second store on `db` (as a second process): its migrations
/// were a no-op, it reads what `s` wrote, `racers` race for one first
/// grading, it keeps the whole contract, and names written past the
/// stores that are none of theirs read as corrupt.
async fn second_process(s: &Store, again: &Store, db: &Db, racers: &[Store]) {
    let steps = MIGRATIONS.steps.len() as u64;
    assert_eq!(MIGRATIONS.check(db).await.unwrap(), steps);
    reopened_store_keeps_rows(s, again).await;
    racing_finish_gradings_write_one(racers, &run_id()).await;
    run_all(again).await;
    unknown_names_read_as_corrupt(s, db).await;
}

#[path = "../../../hatchery-store/tests/support/pg_server.rs"]
#[allow(dead_code)]
mod pg_server;

/// PostgreSQL: a private server (`make unit` skips this test by its name;
/// `make pg-conformance` runs it). It fails, never skips, without one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_on_postgres() {
    let pg = pg_server::TestPg::start();
    let db = Db::postgres(&pg.dsn, 16).unwrap();
    let s = open(&db).await;
    run_all(&s).await;
    // Migrations are idempotent: two more daemons on the same database,
    // starting at once.
    let (dba, dbb) = (
        Db::postgres(&pg.dsn, 8).unwrap(),
        Db::postgres(&pg.dsn, 8).unwrap(),
    );
    let (a, b) = tokio::join!(DbStore::open(dba.clone()), DbStore::open(dbb));
    let (again, other): (Store, Store) = (Arc::new(a.unwrap()), Arc::new(b.unwrap()));
    // Three pools (as three daemons) race for one first grading.
    let racers = [s.clone(), again.clone(), other.clone()];
    second_process(&s, &again, &dba, &racers).await;
    session_holds_exclude_other_processes(&s, &other).await;
    drop((s, again, other, racers, db));
}

/// A previous release's PostgreSQL tables (its own runner's, recorded in
/// `rounds_schema`) are adopted with their rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previous_release_tables_upgrade_in_place_conformance_on_postgres() {
    let pg = pg_server::TestPg::start();
    // A schema of its own: the database may be shared with other suites
    // (HATCHERY_TEST_PG_DSN), which have their own `rounds` table.
    let dsn = hatchery_db::scratch_schema(&pg.dsn).await.unwrap();
    let db = Db::postgres(&dsn, 4).unwrap();
    let mut tx = db.begin().await.unwrap();
    // The previous release's step 1 (crates/hatchery-rounds/src/store/pg.rs),
    // two of its tables, with a row each.
    tx.batch(
        "CREATE TABLE rounds_schema (version BIGINT NOT NULL);
         INSERT INTO rounds_schema VALUES (1);
         CREATE TABLE rounds (
            id TEXT PRIMARY KEY, name TEXT NOT NULL, state TEXT NOT NULL,
            template TEXT NOT NULL, template_version TEXT NOT NULL, spec TEXT NOT NULL,
            tests TEXT NOT NULL, prepared_snapshot TEXT, error TEXT,
            created_at_ms BIGINT NOT NULL);
         CREATE TABLE round_sessions (
            id TEXT PRIMARY KEY, round_id TEXT NOT NULL REFERENCES rounds(id),
            candidate TEXT NOT NULL, state TEXT NOT NULL, sandbox_id TEXT,
            created_at_ms BIGINT NOT NULL, expires_at_ms BIGINT NOT NULL, error TEXT);
         CREATE INDEX round_sessions_round ON round_sessions(round_id, created_at_ms);
         INSERT INTO rounds VALUES ('rnd_old', 'old', 'ready', 'python', 'v1', '{}', '{}',
            NULL, NULL, 5);
         INSERT INTO round_sessions VALUES ('ses_old', 'rnd_old', 'c', 'live', NULL, 6, 9,
            NULL);",
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let s = open(&db).await;
    assert_eq!(
        s.get_round("rnd_old").await.unwrap().unwrap().state,
        RoundState::Ready
    );
    assert_eq!(
        s.get_session("ses_old")
            .await
            .unwrap()
            .unwrap()
            .expires_at_ms,
        9
    );
    run_all(&s).await;
    // Everything went to that schema.
    let n: i64 = db
        .query_opt(
            "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()",
            args![],
        )
        .await
        .unwrap()
        .unwrap()
        .get(0)
        .unwrap();
    assert_eq!(
        n, 10,
        "rounds_schema, hatchery_migrations and 8 rounds tables"
    );
}

/// A database that is not there is unavailable (retryable, answered 503).
#[tokio::test]
async fn a_database_that_is_down_is_unavailable() {
    let db = Db::postgres("postgres://postgres@127.0.0.1:1/hatchery", 1).unwrap();
    let Err(e) = DbStore::open(db).await else {
        panic!("connected to port 1")
    };
    assert!(e.unavailable(), "{e:?}");
}
