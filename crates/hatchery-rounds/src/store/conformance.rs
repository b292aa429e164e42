//! The contract of the rounds store, run on both databases: SQLite in
//! `make unit`, PostgreSQL in `make pg-conformance` (a private server the
//! test starts, or the one `HATCHERY_TEST_PG_DSN` names). Every id
//! carries a per-run suffix and every check looks only at its own rows, so
//! a database may be reused by later runs (and holds other runs' rows).

use super::*;
use crate::state::{RoundState, SessionState, ALL_ROUND, ALL_SESSION};
use hatchery_db::{args, run_id, Db};
use std::sync::Arc;
use std::time::{Duration, Instant};

type Store = Arc<dyn RoundStore>;

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
        tenant: None,
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
        scope: session_id.map_or(Scope::Reviewer, |_| Scope::Candidate),
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

fn replay(id: &str, session_id: &str, at: u64, expires_at_ms: u64, state: &str) -> ReplayRecord {
    ReplayRecord {
        id: id.into(),
        session_id: session_id.into(),
        round_id: format!("rnd_of_{session_id}"),
        snapshot_id: format!("snp_{id}"),
        reason: "end".into(),
        created_at_ms: at,
        expires_at_ms,
        state: state.into(),
    }
}

/// A round in `state`, stored.
async fn add_round(s: &Store, id: &str, state: RoundState) -> RoundRecord {
    let r = round(id, state, 1);
    s.insert_round(&r).await.unwrap();
    r
}

/// `ses`, stored with its candidate token `h_<id>`.
async fn add_session(s: &Store, ses: &SessionRecord) {
    let t = token(&format!("h_{}", ses.id), &ses.round_id, Some(&ses.id));
    s.insert_session(ses, &t).await.unwrap();
}

/// A ready round `rnd_<name>_<run>` and a session in it in `state`,
/// `ses_<name>_<run>`, with its candidate token.
async fn seed(s: &Store, name: &str, run: &str, state: SessionState) -> SessionRecord {
    let rnd = add_round(s, &format!("rnd_{name}_{run}"), RoundState::Ready).await;
    let ses = session(&format!("ses_{name}_{run}"), &rnd.id, state, 1_000);
    add_session(s, &ses).await;
    ses
}

/// An id no check of this run stores, in any table.
fn none(run: &str) -> String {
    format!("none_{run}")
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

/// Records `sub` and moves its session to `submitted`; whether it did.
async fn submit(s: &Store, sub: &SubmissionRecord) -> bool {
    let from = SessionState::sources(SessionState::Submitted);
    s.begin_submission(sub, &from).await.unwrap()
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
    doc_log_appends_in_order_once_and_goes_with_notes(s, &run).await;
}

async fn doc_log_appends_in_order_once_and_goes_with_notes(s: &Store, run: &str) {
    let sid = format!("ses_dl_{run}");
    let entry = |idx: u64, kind: &str, body: &[u8]| DocLogRecord {
        session_id: sid.clone(),
        idx,
        kind: kind.into(),
        author: "candidate".into(),
        ref_id: (kind == "run").then(|| format!("run_{idx}")),
        body: body.to_vec(),
        created_at_ms: 10 + idx,
    };
    // Appended out of order, read back in idx order.
    for e in [
        entry(0, "seed", b"\x00\x01"),
        entry(2, "run", b""),
        entry(1, "update", &[0xff; 300]),
    ] {
        s.append_doc_log(&e).await.unwrap();
    }
    let log = s.doc_log(&sid, None).await.unwrap();
    assert_eq!(log.iter().map(|e| e.idx).collect::<Vec<_>>(), [0, 1, 2]);
    assert_eq!(log[1], entry(1, "update", &[0xff; 300]), "bytes round-trip");
    assert_eq!(log[2].ref_id.as_deref(), Some("run_2"));
    assert_eq!(
        s.doc_log(&sid, Some(1)).await.unwrap().len(),
        2,
        "up to an idx"
    );
    // Entry n is taken once: a second process appending it conflicts.
    let e = s
        .append_doc_log(&entry(1, "update", b"x"))
        .await
        .unwrap_err();
    assert!(e.conflict(), "{e}");
    // The tail past a checkpoint.
    let tail = s.doc_log_tail(&sid, Some(0), 2).await.unwrap();
    assert_eq!(tail.iter().map(|e| e.idx).collect::<Vec<_>>(), [1, 2]);
    let tail = s.doc_log_tail(&sid, None, 1).await.unwrap();
    assert_eq!(tail.iter().map(|e| e.idx).collect::<Vec<_>>(), [0, 1]);
    assert!(s.doc_log_tail(&sid, Some(2), 9).await.unwrap().is_empty());
    // Checkpoints: held to a count and a size, exactly at each.
    let cp = |idx: u64, len: usize| DocCheckpointRecord {
        session_id: sid.clone(),
        idx,
        state: vec![idx as u8; len],
        log_bytes: 100 + idx,
        created_at_ms: 7,
    };
    assert!(s.doc_checkpoint(&sid, 2).await.unwrap().is_none());
    let put = |cps: Vec<DocCheckpointRecord>, count: usize, bytes: u64| {
        let s = s.clone();
        async move { s.put_doc_checkpoints(&cps, count, bytes).await.unwrap() }
    };
    assert_eq!(
        put(vec![cp(0, 10), cp(1, 20)], 8, 30).await,
        2,
        "at the byte cap"
    );
    assert_eq!(put(vec![cp(2, 1)], 8, 30).await, 0, "a byte past it");
    assert_eq!(put(vec![cp(2, 1)], 2, 1 << 20).await, 0, "past the count");
    assert_eq!(
        put(vec![cp(1, 5), cp(2, 1)], 3, 1 << 20).await,
        1,
        "one kept"
    );
    assert_eq!(
        s.doc_checkpoints(&sid).await.unwrap(),
        [cp(0, 10), cp(1, 20), cp(2, 1)]
    );
    assert_eq!(s.doc_checkpoint(&sid, 1).await.unwrap(), Some(cp(1, 20)));
    assert_eq!(s.doc_checkpoint(&sid, 9).await.unwrap(), Some(cp(2, 1)));
    // Only beside a log entry of the session.
    assert!(s
        .put_doc_checkpoints(&[cp(3, 1)], 8, 1 << 20)
        .await
        .is_err());
    assert_eq!(s.doc_checkpoints(&sid).await.unwrap().len(), 3);
    // Notes: replaced whole.
    assert!(s.get_notes(&sid).await.unwrap().is_none());
    let n = |text: &str, at: u64| NotesRecord {
        session_id: sid.clone(),
        text: text.into(),
        author: "interviewer:x".into(),
        updated_at_ms: at,
    };
    s.put_notes(&n("first", 1)).await.unwrap();
    s.put_notes(&n("second", 2)).await.unwrap();
    assert_eq!(s.get_notes(&sid).await.unwrap(), Some(n("second", 2)));
    // Deleted together.
    assert_eq!(s.delete_room_data(&sid).await.unwrap(), 3);
    assert!(s.doc_log(&sid, None).await.unwrap().is_empty());
    assert!(s.doc_checkpoints(&sid).await.unwrap().is_empty());
    assert!(s.get_notes(&sid).await.unwrap().is_none());
}

async fn rounds_insert_get_list(s: &Store, run: &str) {
    let (a, b) = (format!("rnd_la_{run}"), format!("rnd_lb_{run}"));
    let ra = RoundRecord {
        error: Some("e".into()),
        prepared_snapshot: Some("snp_x".into()),
        ..round(&a, RoundState::Preparing, 20)
    };
    for r in [&ra, &round(&b, RoundState::Ready, 10)] {
        s.insert_round(r).await.unwrap();
    }
    // The same record, field for field, from either backend.
    assert_eq!(s.get_round(&a).await.unwrap(), Some(ra.clone()));
    assert_eq!(s.get_round(&none(run)).await.unwrap(), None);
    // The same id twice: a conflict, the first one kept.
    let again = RoundRecord {
        name: "other".into(),
        ..round(&a, RoundState::Ready, 30)
    };
    conflict(s.insert_round(&again).await);
    assert_eq!(s.get_round(&a).await.unwrap(), Some(ra));
    // Oldest first (the database may hold other runs' rounds).
    let listed = s.list_rounds().await.unwrap();
    let listed: Vec<_> = listed.iter().filter(|r| r.id.ends_with(run)).collect();
    assert_eq!(ids(&listed, |r| &r.id), [b, a]);
}

async fn round_moves_name_their_source_state(s: &Store, run: &str) {
    let mut n = 0;
    for to in ALL_ROUND {
        let from = RoundState::sources(to);
        for st in ALL_ROUND {
            n += 1;
            let id = format!("rnd_mv{n}_{run}");
            let before = add_round(s, &id, st).await;
            let set = s.set_round_state(&id, &from, to, Some("snp"), Some("why"));
            let moved = set.await.unwrap();
            let ok = from.contains(&st);
            let want = if ok {
                // A second racer finds it moved.
                assert!(!move_round(s, &id, &from, to).await);
                RoundRecord {
                    state: to,
                    prepared_snapshot: Some("snp".into()),
                    error: Some("why".into()),
                    ..before
                }
            } else {
                // Refused, final states included: nothing written.
                before
            };
            let got = s.get_round(&id).await.unwrap();
            assert_eq!((moved, got), (ok, Some(want)), "{st:?} -> {to:?}");
        }
    }
    // A final state is never left, whatever the move.
    let id = format!("rnd_final_{run}");
    add_round(s, &id, RoundState::Archived).await;
    for to in ALL_ROUND {
        assert!(!move_round(s, &id, &RoundState::sources(to), to).await);
    }
    let got = s.get_round(&id).await.unwrap().unwrap();
    assert_eq!(got.state, RoundState::Archived);
    // What is not given is kept.
    let id = format!("rnd_keep_{run}");
    let (prep, ready) = ([RoundState::Preparing], RoundState::Ready);
    add_round(s, &id, RoundState::Preparing).await;
    let set = s.set_round_state(&id, &prep, ready, Some("snp_k"), None);
    set.await.unwrap();
    move_round(s, &id, &[RoundState::Ready], RoundState::Archived).await;
    let r = s.get_round(&id).await.unwrap().unwrap();
    assert_eq!(
        (r.state, r.prepared_snapshot.as_deref(), r.error),
        (RoundState::Archived, Some("snp_k"), None)
    );
    // Nothing moves an unknown round.
    assert!(!move_round(s, &none(run), &prep, ready).await);
}

async fn session_and_token_are_one_transaction(s: &Store, run: &str) {
    let rnd = format!("rnd_st_{run}");
    add_round(s, &rnd, RoundState::Ready).await;
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
    // A token hash already taken, or a round that does not exist: refused,
    // and neither the session nor a new token is left behind.
    let (sid3, sid4) = (format!("ses_st3_{run}"), format!("ses_st4_{run}"));
    let tok4 = token(&format!("h4_{run}"), &rnd, Some(&sid4));
    for (ses, tok) in [
        (session(&sid3, &rnd, SessionState::Ready, 100), &tok),
        (session(&sid4, &none(run), SessionState::Ready, 100), &tok4),
    ] {
        assert!(s.insert_session(&ses, tok).await.is_err());
        assert_eq!(s.get_session(&ses.id).await.unwrap(), None);
    }
    assert_eq!(s.get_token(&tok4.hash).await.unwrap(), None);
    // A reviewer token, on its own.
    let rev = token(&format!("hr_{run}"), &rnd, None);
    s.insert_token(&rev).await.unwrap();
    assert_eq!(s.get_token(&rev.hash).await.unwrap(), Some(rev.clone()));
    conflict(s.insert_token(&rev).await);
    assert_eq!(s.get_token(&none(run)).await.unwrap(), None);
}

async fn sessions_by_round_and_state(s: &Store, run: &str) {
    let rnd = format!("rnd_ss_{run}");
    add_round(s, &rnd, RoundState::Ready).await;
    let id = |n: usize| format!("ses_ss{n}_{run}");
    for (n, st) in ALL_SESSION.into_iter().enumerate() {
        // Newest first in insertion order: the list is by creation time.
        let ses = SessionRecord {
            created_at_ms: 100 - n as u64,
            ..session(&id(n), &rnd, st, 100)
        };
        add_session(s, &ses).await;
    }
    seed(s, "ssx", run, SessionState::Live).await;
    let listed = s.list_sessions(&rnd).await.unwrap();
    let newest_first: Vec<_> = (0..6).rev().map(id).collect();
    assert_eq!(ids(&listed, |x| &x.id), newest_first);
    assert!(s.list_sessions(&none(run)).await.unwrap().is_empty());
    for (n, st) in ALL_SESSION.into_iter().enumerate() {
        let all = s.sessions_in_state(st).await.unwrap();
        assert!(all.iter().all(|x| x.state == st));
        let ours = mine(all, |x| x.round_id == rnd, |x| x.id);
        assert_eq!(ours, [id(n)], "{st:?}");
    }
}

async fn expired_sessions_are_the_unended_past_expiry(s: &Store, run: &str) {
    let rnd = format!("rnd_ex_{run}");
    add_round(s, &rnd, RoundState::Ready).await;
    let id = |n: &str| format!("ses_ex{n}_{run}");
    for (name, st, exp) in [
        ("a", SessionState::Live, 100),
        ("b", SessionState::Graded, 200),
        ("c", SessionState::Ended, 50),
        ("d", SessionState::Preparing, 300),
    ] {
        add_session(s, &session(&id(name), &rnd, st, exp)).await;
    }
    let rnd = &rnd;
    let expired = |now: u64| async move {
        let v = s.expired_sessions(now).await.unwrap();
        mine(v, |x| x.round_id == *rnd, |x| x.id)
    };
    assert!(expired(99).await.is_empty());
    assert_eq!(expired(100).await, [id("a")]);
    assert_eq!(expired(299).await, [id("a"), id("b")]);
    assert_eq!(expired(u64::MAX).await, [id("a"), id("b"), id("d")]);
}

async fn session_moves_name_their_source_state(s: &Store, run: &str) {
    let rnd = format!("rnd_sm_{run}");
    add_round(s, &rnd, RoundState::Ready).await;
    let mut n = 0;
    for to in ALL_SESSION {
        let from = SessionState::sources(to);
        for st in ALL_SESSION {
            n += 1;
            let sid = format!("ses_sm{n}_{run}");
            let ses = SessionRecord {
                sandbox_id: None,
                ..session(&sid, &rnd, st, 100)
            };
            add_session(s, &ses).await;
            let set = s.set_session_state(&sid, &from, to, Some("sbx_new"), Some("why"));
            let moved = set.await.unwrap();
            let ok = from.contains(&st);
            let want = if ok {
                assert!(!move_session(s, &sid, &[st], to).await);
                SessionRecord {
                    state: to,
                    sandbox_id: Some("sbx_new".into()),
                    error: Some("why".into()),
                    ..ses
                }
            } else {
                ses
            };
            let got = s.get_session(&sid).await.unwrap();
            assert_eq!((moved, got), (ok, Some(want)), "{st:?} -> {to:?}");
        }
    }
    // `ended` is never left; what is not given is kept.
    let ses = seed(s, "smend", run, SessionState::Live).await;
    let sid = ses.id.clone();
    let (live, ended) = ([SessionState::Live], SessionState::Ended);
    let set = s.set_session_state(&sid, &live, ended, None, Some("expired"));
    assert!(set.await.unwrap());
    for to in ALL_SESSION {
        assert!(!move_session(s, &sid, &SessionState::sources(to), to).await);
    }
    let got = s.get_session(&sid).await.unwrap().unwrap();
    assert_eq!(
        (got.state, got.sandbox_id, got.error.as_deref()),
        (ended, ses.sandbox_id, Some("expired"))
    );
    assert!(!move_session(s, &none(run), &live, ended).await);
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
    for (ses, n) in [(&a, 5), (&b, 2)] {
        for i in 0..n {
            s.insert_run(&rec(ses, i), 3).await.unwrap();
        }
    }
    let runs = |ses: &str, r: std::ops::Range<u64>| r.map(|i| rec(ses, i)).collect::<Vec<_>>();
    assert_eq!(s.list_runs(&a).await.unwrap(), runs(&a, 2..5));
    assert_eq!(s.list_runs(&b).await.unwrap(), runs(&b, 0..2));
    conflict(s.insert_run(&rec(&b, 1), 3).await);
    assert_eq!(s.list_runs(&b).await.unwrap(), runs(&b, 0..2));
    s.insert_run(&rec(&a, 7), 1).await.unwrap();
    assert_eq!(s.list_runs(&a).await.unwrap(), [rec(&a, 7)]);
    assert!(s.list_runs(&none(run)).await.unwrap().is_empty());
}

async fn begin_submission_is_guarded(s: &Store, run: &str) {
    let ses = seed(s, "bs", run, SessionState::Live).await;
    let sub = |n: u32, ses: &SessionRecord| submission(&format!("sub_bs{n}_{run}"), ses);
    let sub1 = sub(1, &ses);
    assert!(submit(s, &sub1).await);
    assert_eq!(session_state(s, &ses.id).await, SessionState::Submitted);
    let got = s.get_submission(&sub1.id).await.unwrap();
    assert_eq!(got, Some(sub1.clone()));
    // A second submit while one is graded: refused, nothing written.
    let sub2 = sub(2, &ses);
    assert!(!submit(s, &sub2).await);
    assert_eq!(s.get_submission(&sub2.id).await.unwrap(), None);
    let listed = s.list_submissions(&ses.id).await.unwrap();
    assert_eq!(listed, vec![sub1.clone()]);
    // Graded: may submit again; the list is in submission order.
    assert!(move_session(s, &ses.id, &[SessionState::Submitted], SessionState::Graded).await);
    let sub3 = SubmissionRecord {
        created_at_ms: 1,
        ..sub(3, &ses)
    };
    assert!(submit(s, &sub3).await);
    assert_eq!(s.list_submissions(&ses.id).await.unwrap(), [sub1, sub3]);
    // Ended, or an unknown session: refused, nothing written.
    let ended = seed(s, "bse", run, SessionState::Ended).await;
    let ghost = session(&none(run), &ses.round_id, SessionState::Live, 1);
    for (n, ses) in [(4, &ended), (5, &ghost)] {
        let sub = sub(n, ses);
        assert!(!submit(s, &sub).await);
        assert_eq!(s.get_submission(&sub.id).await.unwrap(), None);
        assert!(s.list_submissions(&ses.id).await.unwrap().is_empty());
    }
    assert_eq!(session_state(s, &ended.id).await, SessionState::Ended);
}

async fn finish_grading_writes_the_first_only(s: &Store, run: &str) {
    let ses = seed(s, "fg", run, SessionState::Live).await;
    let sub = submission(&format!("sub_fg_{run}"), &ses);
    assert!(submit(s, &sub).await);
    // The widest counts read back as written.
    let g = GradingRecord {
        passed: u32::MAX,
        total: u32::MAX,
        ..grading(&format!("grd_fg1_{run}"), &sub.id)
    };
    assert!(s.finish_grading(&g, &ses.id).await.unwrap());
    assert_eq!(s.list_gradings(&sub.id).await.unwrap(), vec![g.clone()]);
    assert_eq!(session_state(s, &ses.id).await, SessionState::Graded);
    // A later duplicate (another process graded it too): nothing written,
    // and the session (submitted again meanwhile) is not moved.
    let sub2 = submission(&format!("sub_fg2_{run}"), &ses);
    assert!(submit(s, &sub2).await);
    let dup = grading(&format!("grd_fg2_{run}"), &sub.id);
    assert!(!s.finish_grading(&dup, &ses.id).await.unwrap());
    assert_eq!(s.list_gradings(&sub.id).await.unwrap(), [g]);
    assert_eq!(session_state(s, &ses.id).await, SessionState::Submitted);
    // A session that ended while it was graded keeps `ended`; the grading
    // is stored.
    assert!(move_session(s, &ses.id, &[SessionState::Submitted], SessionState::Ended).await);
    let g2 = grading(&format!("grd_fg3_{run}"), &sub2.id);
    assert!(s.finish_grading(&g2, &ses.id).await.unwrap());
    assert_eq!(s.list_gradings(&sub2.id).await.unwrap(), [g2]);
    assert_eq!(session_state(s, &ses.id).await, SessionState::Ended);
    // A submission that is not stored: refused, nothing written.
    let ghost = grading(&format!("grd_fg4_{run}"), &none(run));
    conflict(s.finish_grading(&ghost, &ses.id).await);
    assert!(s.list_gradings(&none(run)).await.unwrap().is_empty());
}

/// 8 first gradings of one submission at once, spread over `stores` (on
/// one database: two processes): exactly one is written.
async fn racing_finish_gradings_write_one(stores: &[Store], run: &str) {
    let s = &stores[0];
    let ses = seed(s, "race", run, SessionState::Live).await;
    let sub = submission(&format!("sub_race_{run}"), &ses);
    assert!(submit(s, &sub).await);
    let wrote = hatchery_db::race(8, |i| {
        let st = stores[i % stores.len()].clone();
        let sid = ses.id.clone();
        let g = grading(&format!("grd_race{i}_{run}"), &sub.id);
        async move { (st.finish_grading(&g, &sid).await.unwrap(), g.id) }
    })
    .await;
    let won: Vec<_> = wrote.into_iter().filter(|w| w.0).map(|w| w.1).collect();
    assert_eq!(won.len(), 1, "exactly one of 8 racing gradings is written");
    let stored = s.list_gradings(&sub.id).await.unwrap();
    assert_eq!(ids(&stored, |g| &g.id), won);
    assert_eq!(session_state(s, &ses.id).await, SessionState::Graded);
}

async fn regrades_add_rows(s: &Store, run: &str) {
    let ses = seed(s, "rg", run, SessionState::Live).await;
    let sub = submission(&format!("sub_rg_{run}"), &ses);
    assert!(submit(s, &sub).await);
    let first = grading(&format!("grd_rg0_{run}"), &sub.id);
    assert!(s.finish_grading(&first, &ses.id).await.unwrap());
    let mut all = vec![first];
    for i in 1..3 {
        let g = GradingRecord {
            status: "error".into(),
            passed: 0,
            // Listed in insertion order, not by time.
            created_at_ms: 10 - i,
            ..grading(&format!("grd_rg{i}_{run}"), &sub.id)
        };
        s.insert_grading(&g).await.unwrap();
        all.push(g);
    }
    assert_eq!(s.list_gradings(&sub.id).await.unwrap(), all);
    conflict(s.insert_grading(&all[1]).await);
    assert_eq!(s.list_gradings(&sub.id).await.unwrap(), all);
    assert_eq!(session_state(s, &ses.id).await, SessionState::Graded);
    // A regrade is never a first grading: finish_grading refuses after it.
    let late = grading(&format!("grd_rg9_{run}"), &sub.id);
    assert!(!s.finish_grading(&late, &ses.id).await.unwrap());
    assert_eq!(s.list_gradings(&sub.id).await.unwrap(), all);
}

async fn replays_fall_due_and_expire_once(s: &Store, run: &str) {
    let ses = format!("ses_rp_{run}");
    let rec = |n: &str, at, exp, state| replay(&format!("rpl_{n}_{run}"), &ses, at, exp, state);
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
    let listed = s.list_replays(&ses).await.unwrap();
    assert_eq!(listed, [b.clone(), c.clone(), a.clone()]);
    let ses = &ses;
    let due = |now: u64| async move {
        let v = s.due_replays(now).await.unwrap();
        mine(v, |r| r.session_id == *ses, |r| r.id)
    };
    assert!(due(9).await.is_empty());
    assert_eq!(due(10).await, vec![a.id.clone()]);
    assert_eq!(due(20).await, [a.id.clone(), b.id.clone()]);
    assert!(s.expire_replay(&a.id).await.unwrap());
    assert!(!s.expire_replay(&a.id).await.unwrap(), "expired twice");
    assert!(!s.expire_replay(&c.id).await.unwrap());
    assert!(!s.expire_replay(&none(run)).await.unwrap());
    assert_eq!(due(20).await, vec![b.id.clone()]);
    assert_eq!(s.get_replay(&a.id).await.unwrap().unwrap().state, "expired");
    assert_eq!(s.get_replay(&none(run)).await.unwrap(), None);
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
    let listed = s.list_forks(&rpl).await.unwrap();
    assert_eq!(listed, [f2.clone(), f1.clone()]);
    assert!(s.delete_fork(&f1.id).await.unwrap());
    assert!(!s.delete_fork(&f1.id).await.unwrap());
    assert_eq!(s.get_fork(&f1.id).await.unwrap(), None);
    assert_eq!(s.list_forks(&rpl).await.unwrap(), [f2]);
    assert!(s.list_forks(&none(run)).await.unwrap().is_empty());
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
    let r = round(&id, RoundState::Ready, big);
    assert!(s.insert_round(&r).await.is_err());
    assert_eq!(s.get_round(&id).await.unwrap(), None);
    // A session's expiry or its token's: neither row is written.
    let (sid, sid2) = (format!("ses_big_{run}"), format!("ses_big2_{run}"));
    let tok2 = TokenRecord {
        expires_at_ms: big,
        ..token(&format!("h_big2_{run}"), &edge, Some(&sid2))
    };
    let tok = token(&format!("h_big_{run}"), &edge, Some(&sid));
    for (ses, tok) in [
        (session(&sid, &edge, SessionState::Ready, u64::MAX), tok),
        (session(&sid2, &edge, SessionState::Ready, 1), tok2),
    ] {
        assert!(s.insert_session(&ses, &tok).await.is_err());
        assert_eq!(s.get_session(&ses.id).await.unwrap(), None);
        assert_eq!(s.get_token(&tok.hash).await.unwrap(), None);
    }
    let mut rp = replay(&format!("rpl_big_{run}"), &sid2, 1, big, "active");
    assert!(s.insert_replay(&rp).await.is_err());
    rp.expires_at_ms = 1;
    s.insert_replay(&rp).await.unwrap();
    let run_rec = RunRecord {
        id: format!("run_big_{run}"),
        session_id: sid2.clone(),
        created_at_ms: big,
        result: "{}".into(),
    };
    assert!(s.insert_run(&run_rec, 3).await.is_err());
    assert!(s.list_runs(&sid2).await.unwrap().is_empty());
}

/// What one store wrote, another opened later on the same database reads.
async fn reopened_store_keeps_rows(first: &Store, second: &Store) {
    let ses = seed(first, "reopen", &run_id(), SessionState::Live).await;
    let rnd = first.get_round(&ses.round_id).await.unwrap();
    assert_eq!(second.get_round(&ses.round_id).await.unwrap(), rnd);
    assert_eq!(second.get_session(&ses.id).await.unwrap(), Some(ses));
}

/// A stored scope or state that is none of ours reads as `Corrupt`, never
/// as some default: a token whose scope was rewritten must not grant a
/// reviewer's rights, a session in an unknown state must not pass as
/// ended. Both rows are rewritten past the store, on `db` (the trait has
/// no way to store such names), and put right afterwards: a later run on
/// the same database must not meet them.
async fn unknown_names_read_as_corrupt(s: &Store, db: &Db) {
    let ses = seed(s, "bad", &run_id(), SessionState::Live).await;
    let hash = format!("h_{}", ses.id);
    assert!(s.get_token(&hash).await.unwrap().is_some());
    let set = |scope: &'static str, state: &'static str| {
        let (hash, sid) = (hash.clone(), ses.id.clone());
        async move {
            let tokens = "UPDATE round_tokens SET scope = $2 WHERE hash = $1";
            db.execute(tokens, args![hash, scope]).await.unwrap();
            let sessions = "UPDATE round_sessions SET state = $2 WHERE id = $1";
            db.execute(sessions, args![sid, state]).await.unwrap();
        }
    };
    set("admin", "paused").await;
    let corrupt = |e: StoreError, column: &str| {
        assert!(matches!(e, StoreError::Corrupt(_)), "{e:?}");
        assert!(e.to_string().contains(column), "{e}");
    };
    corrupt(s.get_token(&hash).await.unwrap_err(), "scope");
    corrupt(s.get_session(&ses.id).await.unwrap_err(), "state");
    set("candidate", "ended").await;
    assert_eq!(session_state(s, &ses.id).await, SessionState::Ended);
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
    let wait = b.lock_session(&one, true);
    let gave_up = tokio::time::timeout(Duration::from_millis(200), wait).await;
    assert!(gave_up.is_err(), "a held session was granted");
    // A waiter that stays: granted once the holder lets go.
    let waiter = {
        let (b, one) = (b.clone(), one.clone());
        tokio::spawn(async move { b.lock_session(&one, true).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "granted while held");
    drop(held);
    let second = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter was not granted within 5 s")
        .unwrap()
        .unwrap()
        .expect("a wait is never refused");
    assert!(a.lock_session(&one, false).await.unwrap().is_none());
    drop(second);
    // The given-up waiter took the lock after `second` let go, or will,
    // and lets go in turn: nothing stays held. Its release is said on its
    // connection by a task of its own, so this may wait a moment.
    let end = Instant::now() + Duration::from_secs(5);
    while a.lock_session(&one, false).await.unwrap().is_none() {
        assert!(Instant::now() < end, "still held after 5 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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
    let also = again.lock_session("ses_one", false).await.unwrap();
    assert!(held.is_some() && also.is_some());
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
    let pool = || Db::postgres(&pg.dsn, 8).unwrap();
    let (dba, dbb) = (pool(), pool());
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
    let old = s.get_round("rnd_old").await.unwrap().unwrap();
    let ses = s.get_session("ses_old").await.unwrap().unwrap();
    assert_eq!((old.state, ses.expires_at_ms), (RoundState::Ready, 9));
    run_all(&s).await;
    // Everything went to that schema.
    let sql = "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()";
    let rows = db.query(sql, args![]).await.unwrap();
    let n: i64 = rows[0].get(0).unwrap();
    // rounds_schema, hatchery_migrations and the 11 rounds tables.
    assert_eq!(n, 13);
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
